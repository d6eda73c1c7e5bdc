"""The top-level request fields each recorded route takes (chat, completions, Responses, Messages, Gemini): the
official APIs' own (what their SDKs and the agents built on them send) and the engine's sampling and template extensions
the proxy passes on. A field outside them is answered 400 naming it, as the real APIs answer, rather than
dropped without a word or passed to an engine that would act on it unchecked. `STEERING` names the engine
extensions refused on purpose, each with why: they would let a caller steer the engine past the proxy (its
scheduling, its request ids, its cache transfers, the template itself). Operators may allow more fields with
`--allow-request-field` (proxy/boundary.py).

The lists are written out, not read from the `openai` and `anthropic` packages at run time: the proxy does not
depend on them, and importing them costs seconds. tests/test_request_fields.py checks that every field of the
installed SDKs' request types (openai's `ResponseCreateParams`, anthropic's `MessageCreateParams`, its beta
variant and `MessageCountTokensParams`) is here, so an SDK upgrade that adds one fails there first.
"""
from __future__ import annotations

from typing import Any

from proxy.errors import InvalidRequest

# openai 3.57 `ResponseCreateParams` (streaming and not), and fields earlier SDK versions sent.
RESPONSES = frozenset({
    "access_programs", "background", "background_options", "context_management", "conversation", "image",
    "include", "input", "instructions", "max_output_tokens", "max_tool_calls", "metadata", "model", "moderation",
    "parallel_tool_calls", "previous_response_id", "prompt", "prompt_cache_key", "prompt_cache_options",
    "prompt_cache_retention", "reasoning", "safety_identifier", "service_tier", "store", "stream",
    "stream_options", "temperature", "text", "tool_choice", "tools", "top_logprobs", "top_p", "truncation", "user",
    "client_metadata",  # Codex CLI's own (0.169), not in the Python SDK's type
    # vLLM's sampling extensions, which the proxy passes on to the engine (proxy/dialects/responses.py SAMPLING)
    "seed", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "stop",
    "chat_template_kwargs", "logit_bias", "stop_token_ids", "include_stop_str_in_output", "skip_special_tokens",
    "ignore_eos",
})

# anthropic 2.13 `MessageCreateParams` and its beta variant (`betas` and the rest), and the sampling fields
# earlier versions and Claude Code send.
MESSAGES = frozenset({
    "cache_control", "container", "diagnostics", "inference_geo", "max_tokens", "messages", "metadata", "model",
    "output_config", "service_tier", "speed", "stop_sequences", "stream", "system", "thinking", "tool_choice",
    "tools", "user_profile_id", "workspace_id",
    "betas", "billing_policy", "compaction", "context_management", "fallback_credit_token", "fallbacks",
    "mcp_servers", "thread", "output_format",
    "temperature", "top_k", "top_p",
    "chat_template_kwargs",  # vLLM's: Claude Code sends it through CLAUDE_CODE_EXTRA_BODY (e.g. enable_thinking)
})

# anthropic 2.13 `MessageCountTokensParams` and its beta variant.
COUNT_TOKENS = frozenset({
    "cache_control", "messages", "model", "output_config", "speed", "system", "thinking", "tool_choice", "tools",
    "user_profile_id", "workspace_id", "betas", "billing_policy", "compaction", "context_management",
    "mcp_servers", "output_format",
    "chat_template_kwargs",  # as on /v1/messages, so that the count is of the prompt that call renders
})


# The Gemini API's GenerateContentRequest as google-genai 3.3 and Gemini CLI 0.61 send it (camelCase; `model` is
# the path's, proxy/routes/gemini.py), its generationConfig and toolConfig, and countTokens' body. Which of them
# reach the engine, and which are refused as features no engine here has, is proxy/dialects/gemini.py's.
GEMINI = frozenset({
    "contents", "systemInstruction", "tools", "toolConfig", "generationConfig", "safetySettings", "cachedContent",
    "labels", "serviceTier", "store", "model", "continuationToken",
})
GEMINI_GENERATION = frozenset({
    "stopSequences", "responseMimeType", "responseSchema", "responseJsonSchema", "responseModalities",
    "candidateCount", "maxOutputTokens", "temperature", "topP", "topK", "seed", "presencePenalty",
    "frequencyPenalty", "responseLogprobs", "logprobs", "enableEnhancedCivicAnswers", "speechConfig",
    "thinkingConfig", "imageConfig", "mediaResolution", "audioTimestamp", "routingConfig", "modelConfig",
    "enableAffectiveDialog", "audioTranscriptionConfig",
})
GEMINI_TOOL_CONFIG = frozenset({"functionCallingConfig", "retrievalConfig", "includeServerSideToolInvocations"})
GEMINI_COUNT_TOKENS = frozenset({"contents", "generateContentRequest", "model"})

# openai 3.57 chat `CompletionCreateParams` (streaming and not).
_OPENAI_CHAT = {
    "audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs", "max_completion_tokens",
    "max_tokens", "messages", "metadata", "modalities", "model", "moderation", "n", "parallel_tool_calls",
    "prediction", "presence_penalty", "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention",
    "reasoning_effort", "response_format", "safety_identifier", "seed", "service_tier", "stop", "store", "stream",
    "stream_options", "temperature", "tool_choice", "tools", "top_logprobs", "top_p", "user", "verbosity",
    "web_search_options",
}
# openai 3.57 `CompletionCreateParams`.
_OPENAI_COMPLETIONS = {
    "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "model", "n",
    "presence_penalty", "prompt", "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p",
    "user",
}
# vLLM 0.32's sampling extensions, on both routes: they shape how tokens are drawn and when a completion ends,
# within the budget the proxy sets (`min_tokens` and `ignore_eos` stay under `max_tokens`, proxy/boundary.py).
# `structured_outputs` is a sampling constraint like `response_format` (a grammar the tokens must follow).
_VLLM_SAMPLING = {
    "top_k", "min_p", "repetition_penalty", "length_penalty", "stop_token_ids", "include_stop_str_in_output",
    "ignore_eos", "min_tokens", "skip_special_tokens", "spaces_between_special_tokens", "truncate_prompt_tokens",
    "truncation_side", "prompt_logprobs", "logprob_token_ids", "allowed_token_ids", "bad_words", "watermarking",
    "structured_outputs", "repetition_detection", "thinking_token_budget", "stream_interval", "cache_salt",
    "return_token_ids", "return_tokens_as_token_ids", "add_special_tokens", "response_format",
}
# vLLM 0.32's chat-template inputs: values the model's own template reads (never a template).
_VLLM_TEMPLATE = {
    "chat_template_kwargs", "add_generation_prompt", "continue_final_message", "documents", "echo",
    "include_reasoning", "return_prompt_text",
}

CHAT = frozenset(_OPENAI_CHAT | _VLLM_SAMPLING | _VLLM_TEMPLATE)
COMPLETIONS = frozenset(_OPENAI_COMPLETIONS | _VLLM_SAMPLING)

# vLLM extensions refused on every route (the relayed ones included), and why: each acts on the engine itself,
# not on how this call's tokens are drawn.
STEERING: dict[str, str] = {
    "chat_template": "a raw Jinja template would be rendered by the engine in place of the model's own; "
                     "chat_template_kwargs passes values to the model's template",
    "priority": "the engine's scheduling order is the operator's, not a caller's (it would put one tenant's "
                "calls ahead of another's)",
    "request_id": "the engine's request ids are its own: a caller-chosen one can collide with another call's "
                  "and names it in the engine's logs and aborts",
    "session_id": "an engine-side identity shared across requests is the operator's to assign",
    "kv_transfer_params": "directs the engine's KV-cache transfers between instances (disaggregated serving)",
    "ec_transfer_params": "directs the engine's encoder-cache transfers between instances",
    "vllm_xargs": "arbitrary arguments for the engine's custom extensions",
    "prompt_embeds": "tensors fed into the model in place of a prompt, deserialised by the engine",
    "mm_processor_kwargs": "arguments for the engine's multimodal processor (the models trained here are text "
                           "models)",
    "media_io_kwargs": "arguments for the engine's media loaders (the models trained here are text models)",
    "use_beam_search": "beam search answers are not samples of the policy, so their logprobs cannot be "
                       "trained on as such",
    "routed_experts_prompt_start": "an engine diagnostic (mixture-of-experts routing data)",
}

MAX_NAME = 256  # of an unknown field's name in the answer: a body may be megabytes, its echo need not be


def unknown_field(body: dict[str, Any], known: frozenset[str]) -> str | None:
    """The first top-level field of `body` that is not in `known` (in the body's order), or None."""
    name = next((name for name in body if name not in known), None)
    return None if name is None else name[:MAX_NAME]


def refuse_steering(name: str) -> None:
    """400 for a field of `STEERING`, saying why (OpenAI's shape; Anthropic's on the Messages routes)."""
    raise InvalidRequest(f"{name}: not accepted by this proxy: {STEERING[name]}.", param=name,
                         code="unsupported_parameter")


def refuse_unknown_openai(body: dict[str, Any], known: frozenset[str]) -> None:
    """400 as OpenAI answers an unknown parameter."""
    name = unknown_field(body, known)
    if name in STEERING:
        refuse_steering(name)
    if name is not None:
        raise InvalidRequest(f"Unknown parameter: '{name}'.", param=name, code="unknown_parameter")


def refuse_unknown_google(body: dict[str, Any], known: frozenset[str], where: str = "") -> None:
    """400 as Google's APIs answer an unknown field (`where`: the object it sits in, e.g. generationConfig)."""
    name = unknown_field(body, known)
    if not where and name in STEERING:
        refuse_steering(name)
    if name is not None:
        at = f" at '{where}'" if where else ""
        raise InvalidRequest(f'Invalid JSON payload received. Unknown name "{name}"{at}: Cannot find field.',
                             param=f"{where}.{name}" if where else name)


def refuse_unknown_anthropic(body: dict[str, Any], known: frozenset[str]) -> None:
    """400 as Anthropic answers an unknown field (its errors name the field in the message; the route's error
    handler writes it in Anthropic's shape)."""
    name = unknown_field(body, known)
    if name in STEERING:
        refuse_steering(name)
    if name is not None:
        raise InvalidRequest(f"{name}: Extra inputs are not permitted", param=name)
