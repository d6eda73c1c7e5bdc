"""The Gemini API's GenerateContentResponse, built from the engine's chat answer: whole (`build`), or chunk by
chunk as the stream (proxy/dialects/gemini_stream.py) sends it; and the error body of these routes, Google's
`{"error": {"code", "message", "status"}}` with the status named as Google's APIs name it."""
from __future__ import annotations

from typing import Any

from proxy.dialects.messages_objects import tool_input

# HTTP status -> the google.rpc.Code name Google's APIs answer it with (what the SDKs and Gemini CLI read).
STATUS_NAMES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
                405: "UNIMPLEMENTED", 408: "DEADLINE_EXCEEDED", 409: "ABORTED", 413: "INVALID_ARGUMENT",
                415: "INVALID_ARGUMENT", 422: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED",
                500: "INTERNAL", 501: "UNIMPLEMENTED", 502: "UNAVAILABLE", 503: "UNAVAILABLE",
                504: "DEADLINE_EXCEEDED"}
FINISH_REASONS = {"length": "MAX_TOKENS"}  # stop, tool_calls: STOP, as Gemini ends a turn with function calls


def error_body(status: int, message: str, reason: Any = None) -> dict[str, Any]:
    """Google's error shape; a status without a name of its own is FAILED_PRECONDITION below 500 (the caller's to
    fix) and INTERNAL from 500. The proxy's own error code (`json_too_deep`, `key_in_url`, …), when there is one,
    is the `reason` of an ErrorInfo in `details`, where Google's APIs put theirs (`API_KEY_INVALID`)."""
    name = STATUS_NAMES.get(status) or ("FAILED_PRECONDITION" if status < 500 else "INTERNAL")
    error: dict[str, Any] = {"code": status, "message": message, "status": name}
    if isinstance(reason, str) and reason:
        error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason,
                             "domain": "rlproxy"}]
    return {"error": error}


def function_call(call: dict[str, Any]) -> dict[str, Any]:
    """A chat tool call as a `functionCall` part: its arguments as the object `args` is (text that is not a JSON
    object, a model's malformed call, kept whole under `_raw`), its id kept so that the agent's functionResponse
    can name it."""
    function = call.get("function") or {}
    return {"functionCall": {"id": call.get("id") or "", "name": function.get("name") or "",
                             "args": tool_input(function.get("arguments") or "")}}


def parts_of(message: dict[str, Any], thoughts: bool) -> list[dict[str, Any]]:
    """A chat message's reasoning (when the agent asked for thoughts), text and tool calls as parts."""
    parts: list[dict[str, Any]] = []
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    if thoughts and reasoning:
        parts.append({"text": reasoning, "thought": True})
    if message.get("content"):
        parts.append({"text": message["content"]})
    parts += [function_call(call) for call in message.get("tool_calls") or () if isinstance(call, dict)]
    return parts


def finish_reason(reason: str | None) -> str:
    return FINISH_REASONS.get(reason or "", "STOP")


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"promptTokenCount": prompt_tokens, "candidatesTokenCount": completion_tokens,
            "totalTokenCount": prompt_tokens + completion_tokens}


def build(body: dict[str, Any], payload: dict[str, Any], tokens: tuple[int, int], call_id: str) -> dict[str, Any]:
    """The GenerateContentResponse the agent receives for a finished call: one candidate per chat choice."""
    thoughts = wants_thoughts(body)
    candidates = []
    for position, choice in enumerate(payload.get("choices") or ()):
        if not isinstance(choice, dict):
            continue
        message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
        candidates.append({"content": {"role": "model", "parts": parts_of(message, thoughts)},
                           "finishReason": finish_reason(choice.get("finish_reason")),
                           "index": choice.get("index", position)})
    return {"candidates": candidates, "usageMetadata": usage(*tokens), "modelVersion": body["model"],
            "responseId": call_id}


def wants_thoughts(body: dict[str, Any]) -> bool:
    """Whether the agent asked for the model's thoughts (`thinkingConfig.includeThoughts`), as Gemini sends them."""
    config = (body.get("generationConfig") or {}).get("thinkingConfig")
    return isinstance(config, dict) and config.get("includeThoughts") is True
