"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`), translated to and from the
engine's chat route.

The translation follows vLLM's own `/v1/messages` (which is itself a translation to chat inside the engine), so
the prompt is the one the engine would have rendered: `system` text first (blocks joined as they are, Claude
Code's per-request billing-header block left out), `text` and `image` blocks as chat parts, `tool_use` blocks as
the assistant's `tool_calls` (input as JSON text), `tool_result` blocks as `tool` messages, thinking blocks as the
message's `reasoning`, an assistant turn kept even when it has no text; `tools` as functions, `tool_choice`
`any` as `required`, `stop_sequences` as `stop`.

Errors on these routes use Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`.
"""
from __future__ import annotations

import json
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from proxy.dialects import fields
from proxy.dialects.base import Output, engine_error_message, imported_later, text_of
from proxy.dialects.checks import plainly_valid_messages
from proxy.errors import InvalidRequest
from proxy.limits import too_deep
from proxy.schemas import validate

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 422: "invalid_request_error",
               429: "rate_limit_error", 500: "api_error", 502: "api_error", 503: "overloaded_error",
               504: "api_error", 529: "overloaded_error"}
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}
BILLING_HEADER = "x-anthropic-billing-header"  # Claude Code's attribution block in `system`
# The stream module imports this one: it is imported on first use.
_stream_type = imported_later("proxy.dialects.messages_stream", "MessagesStream")


class MessagesRequest(BaseModel):
    """What the proxy checks; the other fields the API knows (proxy/dialects/fields.py) are the agent's own and
    are recorded as sent, and any other is refused (400 naming it)."""

    model_config = ConfigDict(extra="allow")

    model: StrictStr = Field(min_length=1)
    max_tokens: StrictInt = Field(ge=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: Any = None
    stream: StrictBool | None = None
    stop_sequences: list[StrictStr] | None = None
    tools: list[dict[str, Any]] | None = None


class CountTokensRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: StrictStr = Field(min_length=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: Any = None
    tools: list[dict[str, Any]] | None = None


class MessagesDialect:
    route = "messages"
    path = "/v1/messages"

    def validate(self, body: dict[str, Any], model: type[BaseModel] = MessagesRequest) -> None:
        if model is not MessagesRequest or not plainly_valid_messages(body):
            validate(model, body)
        fields.refuse_unknown_anthropic(body, fields.MESSAGES if model is MessagesRequest else fields.COUNT_TOKENS)
        system = body.get("system")
        if system is not None and not isinstance(system, str) and not (
                isinstance(system, list) and all(isinstance(b, dict) and b.get("type") == "text" for b in system)):
            raise InvalidRequest("system: expected a string or a list of text blocks", param="system")
        for index, message in enumerate(body["messages"]):
            if message.get("role") not in ("user", "assistant", "system"):  # system: a mid-conversation turn
                raise InvalidRequest(f"messages.{index}.role: expected user, assistant or system",
                                     param=f"messages.{index}.role")
            content = message.get("content")
            if not isinstance(content, (str, list)):
                raise InvalidRequest(f"messages.{index}.content: expected a string or a list of content blocks",
                                     param=f"messages.{index}.content")
            for position, block in enumerate(content if isinstance(content, list) else ()):
                if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                    raise InvalidRequest(f"messages.{index}.content.{position}: expected a content block",
                                         param=f"messages.{index}.content.{position}")
                if block["type"] == "tool_result" and not isinstance(block.get("tool_use_id"), str):
                    raise InvalidRequest(f"messages.{index}.content.{position}.tool_use_id: required",
                                         param=f"messages.{index}.content.{position}.tool_use_id")
        for index, tool in enumerate(body.get("tools") or ()):
            if not isinstance(tool.get("name"), str):
                raise InvalidRequest(f"tools.{index}.name: required", param=f"tools.{index}.name")
            if "input_schema" not in tool:
                raise InvalidRequest(f"tools.{index}: server tool {tool.get('type')!r} is not available on this "
                                     "engine; offer a client tool with an input_schema",
                                     param=f"tools.{index}.input_schema")

    # -- request ---------------------------------------------------------------------------------------
    def to_chat(self, body: dict[str, Any], history: list[dict[str, Any]]) -> dict[str, Any]:
        chat: dict[str, Any] = {"model": body["model"], "messages": chat_messages(body),
                                "max_tokens": body["max_tokens"]}
        if body.get("stop_sequences"):
            chat["stop"] = body["stop_sequences"]
        for name in ("temperature", "top_p", "top_k"):
            if body.get(name) is not None:
                chat[name] = body[name]
        user = (body.get("metadata") or {}).get("user_id")
        if isinstance(user, str):
            chat["user"] = user
        if body.get("tools"):
            chat["tools"] = [_chat_tool(t) for t in body["tools"]]
        choice = body.get("tool_choice")
        if isinstance(choice, dict):
            chat["tool_choice"] = _chat_tool_choice(choice)
            if choice.get("disable_parallel_tool_use"):
                chat["parallel_tool_calls"] = False
        elif body.get("tools"):
            chat["tool_choice"] = "auto"
        if body.get("stream"):
            chat["stream"] = True
        return chat

    # -- response --------------------------------------------------------------------------------------
    def build_response(self, body: dict[str, Any], output: Output, call_id: str, created: int) -> dict[str, Any]:
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

    def stream(self, body: dict[str, Any], call_id: str, created: int):
        return _stream_type()(self, body, call_id)

    def engine_error(self, status: int, raw: bytes) -> bytes:
        message, _ = engine_error_message(raw)
        return orjson.dumps(error_body(status, message))

    def chat_view(self, request: dict[str, Any] | None, response: dict[str, Any] | None):
        chat_request = None
        if isinstance(request, dict) and isinstance(request.get("messages"), list):
            try:
                chat_request = {"messages": chat_messages(request, mark_errors=True),
                                "tools": [_chat_tool(t) for t in request.get("tools") or () if isinstance(t, dict)]}
            except (AttributeError, TypeError, KeyError):
                chat_request = None
        chat_response = None
        if isinstance(response, dict) and isinstance(response.get("content"), list):
            chat_response = {"choices": [{"index": 0, "message": assistant_message(response["content"])}]}
        return chat_request, chat_response


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


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
    an object nested too deeply to be written out again (proxy/limits.py)."""
    try:
        parsed = orjson.loads(arguments) if arguments.strip() else {}
    except orjson.JSONDecodeError:
        return {"_raw": arguments}
    return parsed if isinstance(parsed, dict) and not too_deep(parsed) else {"_raw": arguments}


def chat_messages(body: dict[str, Any], *, mark_errors: bool = False) -> list[dict[str, Any]]:
    """The Messages request as chat messages. `mark_errors` (AIR's view only) wraps a `tool_result` that has
    `is_error: true` as `{"is_error": true, "content": …}`, which AIR reads as a tool error."""
    messages: list[dict[str, Any]] = []
    system = _system_text(body.get("system"), whole_string=True)
    if system:
        messages.append({"role": "system", "content": system})
    for message in body["messages"]:
        content = message["content"]
        if message["role"] == "system":  # a turn in the middle: its text, as vLLM takes it
            if system := _system_text(content, whole_string=False):
                messages.append({"role": "system", "content": system})
            continue
        if isinstance(content, str):
            messages.append({"role": message["role"], "content": content})
            continue
        parts: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        thinking: list[str] = []
        for block in content:
            kind = block.get("type")
            if kind == "text" and block.get("text"):
                parts.append({"type": "text", "text": block["text"]})
            elif kind == "image" and isinstance(block.get("source"), dict):
                parts.append({"type": "image_url", "image_url": {"url": _image_url(block["source"])}})
            elif kind == "tool_use":
                calls.append({"id": block.get("id") or "", "type": "function",
                              "function": {"name": block.get("name") or "",
                                           "arguments": _json_text(block.get("input") or {})}})
            elif kind == "tool_result" and message["role"] == "user":
                messages.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                                 "content": _tool_result(block, mark_errors)})
            elif kind == "tool_result":
                parts.append({"type": "text", "text": f"Tool result: {text_of(block.get('content'))}"})
            elif kind == "thinking" and isinstance(block.get("thinking"), str):
                thinking.append(block["thinking"])
        if message["role"] == "user" and not parts:
            continue  # only tool results (now `tool` messages): no user turn, as in vLLM
        chat: dict[str, Any] = {"role": message["role"]}
        if parts:
            chat["content"] = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts
        if calls:
            chat["tool_calls"] = calls
        if thinking:
            chat["reasoning"] = "".join(thinking)
        messages.append(chat)  # an assistant turn is kept even when empty: the template renders it
    return messages


def _system_text(content: Any, *, whole_string: bool) -> str:
    """System text as vLLM's `/v1/messages` takes it: text blocks joined as they are, less Claude Code's
    billing-header block (a per-request hash; the engine's chat route would also cut a line that starts with it,
    taking the next block's first line along once the blocks are joined). vLLM keeps a top-level string whole
    (`whole_string`), but drops a mid-conversation one that is the header."""
    if isinstance(content, str):
        return content if whole_string or not content.startswith(BILLING_HEADER) else ""
    return "".join(block["text"] for block in content or () if isinstance(block, dict)
                   and block.get("type") == "text" and isinstance(block.get("text"), str)
                   and not block["text"].startswith(BILLING_HEADER))


def _json_text(value: Any) -> str:
    """JSON as Python's `json.dumps` writes it (", " and ": "), which is what vLLM renders tool inputs with."""
    return json.dumps(value)


def _tool_result(block: dict[str, Any], mark_errors: bool) -> str:
    content = block.get("content")
    text = content if isinstance(content, str) else "\n".join(
        part.get("text") or "" for part in content or () if isinstance(part, dict) and part.get("type") == "text")
    if mark_errors and block.get("is_error") is True:
        return orjson.dumps({"is_error": True, "content": text}).decode()
    return text


def _image_url(source: dict[str, Any]) -> str:
    if source.get("type") == "base64":
        return f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    return source.get("url") or ""


def assistant_message(content: list[Any]) -> dict[str, Any]:
    text = "".join(b.get("text") or "" for b in content if isinstance(b, dict) and b.get("type") == "text")
    calls = [{"id": b.get("id"), "type": "function", "function": {"name": b.get("name"), "arguments": _arguments(b)}}
             for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _arguments(block: dict[str, Any]) -> str:
    """The text the model wrote for a tool_use block (undoing `tool_input`'s `_raw` for malformed calls)."""
    value = block.get("input")
    if isinstance(value, dict) and list(value) == ["_raw"] and isinstance(value["_raw"], str):
        return value["_raw"]
    return _json_text(value)


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = {"name": tool["name"], "description": tool.get("description"), "parameters": tool.get("input_schema")}
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: dict[str, Any]) -> Any:
    kind = choice.get("type")
    if kind == "tool" and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    return {"any": "required", "none": "none"}.get(kind, "auto")



MESSAGES = MessagesDialect()
