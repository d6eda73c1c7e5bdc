"""How far and how hard a model reasons, as the agent asked, carried into the engine's chat request the way vLLM
0.32's own routes carry it (vllm/entrypoints/anthropic/serving.py `_handle_output_config`, `_handle_thinking`;
vllm/entrypoints/openai/responses/protocol.py `build_chat_params`, `build_tok_params`).

These fields change what a thinking model is given and how long it may think: the chat route turns
`reasoning_effort` into the template's `reasoning_effort` and `enable_thinking` (Qwen3 renders an empty think
block when it is "none"; GLM reads the effort), and `thinking_token_budget` makes the sampler force the end of
thinking once the budget is spent. Dropped, the agent got another prompt and another sampling than the same
engine gives it directly. A form the chat request cannot carry is refused (400 naming it), never dropped.

    Messages  output_config.effort               -> reasoning_effort (low, medium, high, xhigh, max)
              thinking {type: disabled}          -> reasoning_effort "none" (over any effort, as vLLM orders it)
              thinking {type: enabled, budget_tokens}  -> thinking_token_budget
              thinking {type: adaptive}          -> nothing: the model chooses, under the effort if one was given
    Responses reasoning.effort                   -> reasoning_effort
              truncation "auto"                  -> truncate_prompt_tokens -1 (the prompt's start is cut to fit)

vLLM probes the chat template once to pick the effort for thinking disabled: "none", unless the template refuses
"none" (gpt-oss's Harmony) or renders it as it renders a thinking effort (GLM-5.3), where it sends "low". The
proxy sends "none", the probe's answer for every template that reads it; it cannot probe from a translation.
"""
from __future__ import annotations

from typing import Any

from proxy.errors import InvalidRequest

ANTHROPIC_EFFORTS = ("low", "medium", "high", "xhigh", "max")  # vLLM's `AnthropicEffort`, and the SDK's
OPENAI_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")  # the SDK's and vLLM's chat route's
THINKING_TYPES = ("enabled", "disabled", "adaptive")  # what vLLM's Messages route serves
THINKING_DISPLAYS = ("summarized", "omitted", "updates")  # accepted and ignored by vLLM: thinking is always shown
MIN_THINKING_BUDGET = 1024  # Anthropic's and vLLM's floor for `budget_tokens`
DISABLED_THINKING_EFFORT = "none"
TRUNCATIONS = ("auto", "disabled")


def _check_effort(body: dict[str, Any], holder: str, efforts: tuple[str, ...]) -> None:
    """`body[holder]`, when given, is an object whose `effort` (when given) is one of `efforts`."""
    value = body.get(holder)
    if value is not None and not isinstance(value, dict):
        raise InvalidRequest(f"{holder}: expected an object", param=holder)
    effort = (value or {}).get("effort")
    if effort is not None and effort not in efforts:
        raise InvalidRequest(f"{holder}.effort: expected one of {', '.join(efforts)}", param=f"{holder}.effort")


def check_messages(body: dict[str, Any]) -> None:
    """400 for a `thinking` or `output_config.effort` the engine's chat route cannot be given as vLLM's Messages
    route gives it (`max_tokens` is absent on count_tokens: no budget check there, as in vLLM)."""
    _check_effort(body, "output_config", ANTHROPIC_EFFORTS)
    thinking = body.get("thinking")
    if thinking is None:
        return
    if not isinstance(thinking, dict) or not isinstance(thinking.get("type"), str):
        raise InvalidRequest("thinking: expected an object with a type", param="thinking.type")
    kind = thinking["type"]
    if kind not in THINKING_TYPES:  # e.g. `between_tools`: no chat field says it, so it would be dropped
        raise InvalidRequest(f"thinking.type: {kind[:64]!r} is not available on this engine; one of "
                             f"{', '.join(THINKING_TYPES)}", param="thinking.type")
    display = thinking.get("display")
    if kind != "disabled" and display is not None and display not in THINKING_DISPLAYS:
        raise InvalidRequest(f"thinking.display: expected one of {', '.join(THINKING_DISPLAYS)}",
                             param="thinking.display")
    if kind != "enabled":
        return
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < MIN_THINKING_BUDGET:
        raise InvalidRequest(f"thinking.budget_tokens: expected an integer of at least {MIN_THINKING_BUDGET}",
                             param="thinking.budget_tokens")
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, int) and budget >= max_tokens:
        raise InvalidRequest("thinking.budget_tokens: must be less than max_tokens", param="thinking.budget_tokens")


def messages_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The chat request's reasoning fields for a checked Messages body."""
    fields: dict[str, Any] = {}
    effort = (body.get("output_config") or {}).get("effort")
    if effort is not None:
        fields["reasoning_effort"] = effort
    thinking = body.get("thinking") or {}
    if thinking.get("type") == "disabled":
        fields["reasoning_effort"] = DISABLED_THINKING_EFFORT
    elif thinking.get("type") == "enabled":
        fields["thinking_token_budget"] = thinking["budget_tokens"]
    return fields


def check_responses(body: dict[str, Any]) -> None:
    """400 for a `reasoning` or `truncation` the engine's chat route cannot be given as vLLM's Responses route
    gives it. `reasoning.summary`, `generate_summary`, `context` and `mode` are recorded and not forwarded:
    vLLM's route reads none of them for a chat-template model."""
    _check_effort(body, "reasoning", OPENAI_EFFORTS)
    truncation = body.get("truncation")
    if truncation is not None and truncation not in TRUNCATIONS:
        raise InvalidRequest(f"truncation: expected one of {', '.join(TRUNCATIONS)}", param="truncation")


def responses_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The chat request's fields for a checked Responses body's `reasoning` and `truncation`."""
    fields: dict[str, Any] = {}
    effort = (body.get("reasoning") or {}).get("effort")
    if effort is not None:
        fields["reasoning_effort"] = effort
    if body.get("truncation") == "auto":  # vLLM: keep the prompt's end that fits the context, not an error
        fields["truncate_prompt_tokens"] = -1
    return fields
