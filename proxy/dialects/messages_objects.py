"""Anthropic's Message object, built from the engine's answer: whole (`build`), or piece by piece as the stream
(proxy/dialects/messages_stream.py) sends it; and the error body of these routes."""
from __future__ import annotations

from typing import Any

import orjson

from core.messages_chat import RAW_INPUT
from proxy.dialects.base import Output
from proxy.strict_json import too_deep

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 422: "invalid_request_error",
               429: "rate_limit_error", 500: "api_error", 502: "api_error", 503: "overloaded_error",
               504: "api_error", 529: "overloaded_error"}
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}


def error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error shape: `{"type": "error", "error": {"type", "message"}}`. A status without a type of its
    own is `invalid_request_error` below 500 (Anthropic's documented type for "other 4XX status codes": a 405, a
    415, a 408 are the client's to fix, and an SDK or a retry policy reading `api_error` takes them for the
    server's fault) and `api_error` from 500, the same rule the OpenAI-shaped errors keep (proxy/app.py)."""
    kind = ERROR_TYPES.get(status) or ("invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def message_id(call_id: str) -> str:
    return f"msg_{call_id}"


def stop_of(output: Output) -> tuple[str | None, str | None]:
    """Anthropic's (stop_reason, stop_sequence): a matched stop string is reported as such (vLLM puts it in
    `stop_reason`); a finished tool call is `tool_use` whatever the chat layer called it."""
    if output.finish_reason == "length":
        return "max_tokens", None
    if output.tool_calls:
        return "tool_use", None
    if isinstance(output.stop_reason, str):
        return "stop_sequence", output.stop_reason
    return STOP_REASONS.get(output.finish_reason or "", "end_turn"), None


def tool_use_block(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    return {"type": "tool_use", "id": call.get("id") or "", "name": function.get("name") or "",
            "input": tool_input(function.get("arguments") or "")}


def tool_input(arguments: str) -> Any:
    """A tool call's arguments as the object Anthropic's `input` is; text that is not a JSON object (a model's
    malformed call) is kept whole under `_raw` rather than dropped, so the agent can see what went wrong. So is
    an object nested too deeply to be written out again (proxy/strict_json.py)."""
    try:
        parsed = orjson.loads(arguments) if arguments.strip() else {}
    except orjson.JSONDecodeError:
        return {RAW_INPUT: arguments}
    return parsed if isinstance(parsed, dict) and not too_deep(parsed) else {RAW_INPUT: arguments}


def build(body: dict[str, Any], output: Output, call_id: str) -> dict[str, Any]:
    """The Message the agent receives for a finished call."""
    content: list[dict[str, Any]] = []
    if output.reasoning:
        content.append({"type": "thinking", "thinking": output.reasoning, "signature": ""})
    if output.text:
        content.append({"type": "text", "text": output.text})
    content += [tool_use_block(call) for call in output.tool_calls]
    stop_reason, stop_sequence = stop_of(output)
    return {"id": message_id(call_id), "type": "message", "role": "assistant", "model": body["model"],
            "content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence,
            "usage": {"input_tokens": output.prompt_tokens, "output_tokens": output.completion_tokens}}
