"""Optional redaction of text before a call is recorded (`redact_content`): the stored request and response
keep their shape, roles, tool names and every token id (all that training needs), but message text, prompt
strings, completion text, reasoning and tool-call arguments become MARKER, and logprobs entries (which spell
out tokens) are dropped (the sampled logprobs stay in their own columns).

Tool-call arguments become "{}" when they were a JSON object and MARKER otherwise, so the automatic reward
for malformed arguments still fires; whether a tool's result reported an error can no longer be seen.
"""
from __future__ import annotations

from typing import Any

import orjson

from store.records import CallRecord

MARKER = "[redacted]"
_TEXT_FIELDS = ("content", "reasoning", "reasoning_content", "refusal")


def redact_record(record: CallRecord) -> None:
    if record.request is not None:
        record.request = redact_request(record.request)
    if record.response is not None:
        record.response = redact_response(record.response)


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
