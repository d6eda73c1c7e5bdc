"""Anthropic's Messages API conversation in chat form: the request's system text and messages as chat
messages, a Message's content as the assistant's chat message, tools as chat functions. The proxy builds the
engine's prompt with it (proxy/dialects/messages.py), and automatic rewards and the judge read recorded calls
with it (core/chat_view.py).

The translation follows vLLM's own `/v1/messages` (which is itself a translation to chat inside the engine), so
the prompt is the one the engine would have rendered: `system` text first (blocks joined as they are, Claude
Code's per-request billing-header block left out), `text` and `image` blocks as chat parts, `tool_use` blocks as
the assistant's `tool_calls` (input as JSON text), `tool_result` blocks as `tool` messages, thinking blocks as the
message's `reasoning`, an assistant turn kept even when it has no text.
"""
from __future__ import annotations

import json
from typing import Any

import orjson

from core.text import content_text

BILLING_HEADER = "x-anthropic-billing-header"  # Claude Code's attribution block in `system`
RAW_INPUT = "_raw"  # the key a tool call's arguments that are not a JSON object are kept under in `input`


def chat_messages(body: dict[str, Any], *, mark_errors: bool = False) -> list[dict[str, Any]]:
    """The Messages request as chat messages. `mark_errors` (the recorded call's view only) wraps a `tool_result`
    that has `is_error: true` as `{"is_error": true, "content": …}`, which automatic rewards read as a tool error."""
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
                                           "arguments": json_text(block.get("input") or {})}})
            elif kind == "tool_result" and message["role"] == "user":
                messages.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                                 "content": _tool_result(block, mark_errors)})
            elif kind == "tool_result":
                parts.append({"type": "text",
                              "text": f"Tool result: {content_text(block.get('content'), separator='')}"})
            elif kind == "thinking" and isinstance(block.get("thinking"), str):
                thinking.append(block["thinking"])
        if message["role"] == "user" and not parts:
            continue  # only tool results (now `tool` messages): no user turn, as in vLLM
        # an assistant turn is kept even when empty: the template renders it
        messages.append(chat_turn(message["role"], parts, calls, thinking))
    return messages


def chat_turn(role: str, parts: list[dict[str, Any]], calls: list[dict[str, Any]],
              thinking: list[str]) -> dict[str, Any]:
    """One chat message from a turn's content parts, tool calls and thinking (Messages' and Gemini's turns alike):
    a lone text part as plain content, as vLLM's chat route reads it."""
    chat: dict[str, Any] = {"role": role}
    if parts:
        chat["content"] = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts
    if calls:
        chat["tool_calls"] = calls
    if thinking:
        chat["reasoning"] = "".join(thinking)
    return chat


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


def json_text(value: Any) -> str:
    """JSON as Python's `json.dumps` writes it (", " and ": "), which is what vLLM renders tool inputs with."""
    return json.dumps(value)


def _tool_result(block: dict[str, Any], mark_errors: bool) -> str:
    text = content_text(block.get("content"))
    if mark_errors and block.get("is_error") is True:
        return orjson.dumps({"is_error": True, "content": text}).decode()
    return text


def _image_url(source: dict[str, Any]) -> str:
    if source.get("type") == "base64":
        return f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    return source.get("url") or ""


def chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A client tool as a chat function."""
    function = {"name": tool["name"], "description": tool.get("description"), "parameters": tool.get("input_schema")}
    return {"type": "function", "function": function}


def assistant_message(content: list[Any]) -> dict[str, Any]:
    """A Message's content blocks as one chat assistant message (its text, and its tool uses as tool calls)."""
    text = "".join(b.get("text") or "" for b in content if isinstance(b, dict) and b.get("type") == "text")
    calls = [{"id": b.get("id"), "type": "function", "function": {"name": b.get("name"), "arguments": _arguments(b)}}
             for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _arguments(block: dict[str, Any]) -> str:
    """The text the model wrote for a tool_use block (undoing the `_raw` that keeps a malformed call whole)."""
    value = block.get("input")
    if isinstance(value, dict) and list(value) == [RAW_INPUT] and isinstance(value[RAW_INPUT], str):
        return value[RAW_INPUT]
    return json_text(value)


def chat_view(request: dict[str, Any] | None, response: dict[str, Any] | None
              ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """A recorded Messages call in chat form: the request's messages (system first) and the tools it offered;
    the Message's content as choice 0. None for a part that cannot be read."""
    chat_request = None
    if isinstance(request, dict) and isinstance(request.get("messages"), list):
        try:
            chat_request = {"messages": chat_messages(request, mark_errors=True),
                            "tools": [chat_tool(t) for t in request.get("tools") or () if isinstance(t, dict)]}
        except (AttributeError, TypeError, KeyError):
            chat_request = None
    chat_response = None
    if isinstance(response, dict) and isinstance(response.get("content"), list):
        chat_response = {"choices": [{"index": 0, "message": assistant_message(response["content"])}]}
    return chat_request, chat_response
