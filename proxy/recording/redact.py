"""Optional redaction of text before a call is recorded (`redact_content`): the stored request and response
keep their shape, roles, tool names and every token id (all that training needs), but message text, prompt
strings, completion text, reasoning and tool-call arguments become MARKER, and logprobs entries (which spell
out tokens) are dropped (the sampled logprobs stay in their own columns). Responses and Messages calls are
scrubbed the same way (`input`/`instructions`/`output`, `system`/`messages`/`content`), and so are Gemini's
(`systemInstruction`/`contents`/`candidates`).

Tool-call arguments become "{}" when they were a JSON object and MARKER otherwise, so the automatic reward
for malformed arguments still fires; whether a tool's result reported an error can no longer be seen.
"""
from __future__ import annotations

from typing import Any

import orjson

from store.records import CallRecord

MARKER = "[redacted]"
_TEXT_FIELDS = ("content", "reasoning", "reasoning_content", "refusal")


# The text-bearing fields of the Responses and Messages APIs (request, response; a Response echoes its
# instructions); their items are scrubbed whole: every string but the structural ones below becomes MARKER.
DIALECT_FIELDS = {"responses": (("input", "instructions"), ("output", "instructions")),
                  "messages": (("system", "messages"), ("content",)),
                  "gemini": (("systemInstruction", "contents"), ("candidates",))}
_STRUCTURAL = frozenset({"type", "role", "id", "call_id", "tool_call_id", "tool_use_id", "name", "status",
                         "finishReason", "mimeType"})


def redact_record(record: CallRecord) -> None:
    fields = DIALECT_FIELDS.get(record.route)
    if fields is not None:
        record.request = _scrub_fields(record.request, fields[0])
        record.response = _scrub_fields(record.response, fields[1])
        return
    if record.request is not None:
        record.request = redact_request(record.request)
    if record.response is not None:
        record.response = redact_response(record.response)


def _scrub_fields(body: dict[str, Any] | None, names: tuple[str, ...]) -> dict[str, Any] | None:
    if body is None:
        return None
    return {k: _scrub(v) if k in names else v for k, v in body.items()}


def _scrub(value: Any) -> Any:
    """Every string becomes MARKER but structural fields (types, roles, ids, tool names); tool-call arguments keep
    whether they were a JSON object; per-token logprobs (which spell out the text) are emptied."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key in _STRUCTURAL and not isinstance(item, (dict, list)):
                out[key] = item
            elif key == "arguments" and isinstance(item, str):
                out[key] = "{}" if _is_json_object(item) else MARKER
            elif key in ("logprobs", "top_logprobs"):
                out[key] = []
            else:
                out[key] = _scrub(item)
        return out
    if isinstance(value, list):
        return [_scrub(item) for item in value]
    return MARKER if isinstance(value, str) else value


def redact_request(body: dict[str, Any]) -> dict[str, Any]:
    out = dict(body)
    if isinstance(out.get("messages"), list):
        out["messages"] = [_message(m) for m in out["messages"]]
    if "prompt" in out:
        out["prompt"] = _prompt(out["prompt"])
    return out


def redact_response(payload: dict[str, Any]) -> dict[str, Any]:
    out = dict(payload)
    if isinstance(out.get("choices"), list):
        out["choices"] = [_choice(c) for c in out["choices"]]
    return out


def _choice(choice: Any) -> Any:
    if not isinstance(choice, dict):
        return choice
    out = dict(choice)
    if isinstance(out.get("message"), dict):
        out["message"] = _message(out["message"])
    if isinstance(out.get("text"), str):
        out["text"] = MARKER
    if out.get("logprobs") is not None:
        out["logprobs"] = None
    return out


def _message(message: Any) -> Any:
    if not isinstance(message, dict):
        return message
    out = dict(message)
    for name in _TEXT_FIELDS:
        if name in out and out[name] is not None:
            out[name] = _content(out[name])
    if isinstance(out.get("tool_calls"), list):
        out["tool_calls"] = [_tool_call(c) for c in out["tool_calls"]]
    return out


def _content(content: Any) -> Any:
    """A string, or a list of content parts whose strings (text, image URLs, audio data) all go; each part's
    `type` stays."""
    if isinstance(content, list):
        return [{k: v if k == "type" else _content(v) for k, v in part.items()} if isinstance(part, dict)
                else _content(part) for part in content]
    if isinstance(content, dict):
        return {k: _content(v) for k, v in content.items()}
    return MARKER if isinstance(content, str) else content


def _tool_call(call: Any) -> Any:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return call
    function = dict(call["function"])
    if "arguments" in function:
        function["arguments"] = "{}" if _is_json_object(function["arguments"]) else MARKER
    return {**call, "function": function}


def _is_json_object(text: Any) -> bool:
    try:
        return isinstance(text, str) and isinstance(orjson.loads(text), dict)
    except orjson.JSONDecodeError:
        return False


def _prompt(prompt: Any) -> Any:
    """Completions prompts: text goes, token-id prompts stay."""
    if isinstance(prompt, str):
        return MARKER
    if isinstance(prompt, list):
        return [MARKER if isinstance(p, str) else p for p in prompt]
    return prompt
