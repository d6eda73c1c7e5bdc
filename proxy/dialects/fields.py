"""The top-level request fields the Responses and Messages routes take: the official APIs' own (what their SDKs
and the agents built on them send) and the engine's extensions the proxy passes on. A field outside them is
answered 400 naming it, as the real APIs answer, rather than dropped without a word (the proxy builds the
engine's chat request itself, so a field it does not know would otherwise do nothing).

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
})

# anthropic 2.13 `MessageCountTokensParams` and its beta variant.
COUNT_TOKENS = frozenset({
    "cache_control", "messages", "model", "output_config", "speed", "system", "thinking", "tool_choice", "tools",
    "user_profile_id", "workspace_id", "betas", "billing_policy", "compaction", "context_management",
    "mcp_servers", "output_format",
})


MAX_NAME = 256  # of an unknown field's name in the answer: a body may be megabytes, its echo need not be


def unknown_field(body: dict[str, Any], known: frozenset[str]) -> str | None:
    """The first top-level field of `body` that is not in `known` (in the body's order), or None."""
    name = next((name for name in body if name not in known), None)
    return None if name is None else name[:MAX_NAME]


def refuse_unknown_openai(body: dict[str, Any], known: frozenset[str]) -> None:
    """400 as OpenAI answers an unknown parameter."""
    name = unknown_field(body, known)
    if name is not None:
        raise InvalidRequest(f"Unknown parameter: '{name}'.", param=name, code="unknown_parameter")


def refuse_unknown_anthropic(body: dict[str, Any], known: frozenset[str]) -> None:
    """400 as Anthropic answers an unknown field (its errors name the field in the message; the route's error
    handler writes it in Anthropic's shape)."""
    name = unknown_field(body, known)
    if name is not None:
        raise InvalidRequest(f"{name}: Extra inputs are not permitted", param=name)
