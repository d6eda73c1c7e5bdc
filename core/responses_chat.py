"""The OpenAI Responses API's conversation in chat form: input items as chat messages, output items as the
assistant's chat message, tools as chat functions. The proxy builds the engine's prompt with it
(proxy/dialects/responses.py), and automatic rewards and the judge read recorded calls with it (core/chat_view.py).

The translation follows vLLM's own Responses route for chat-template models, so the engine sees the prompt it
would have built itself: message items keep their role (`developer` too) and content; consecutive
`function_call` items join the assistant message before them as `tool_calls`; `function_call_output` items
become `tool` messages; a reasoning item's text becomes the `reasoning` of the assistant message before it (or
of a new one: the turn is rendered even with no text; encrypted reasoning, which this engine cannot have
written, is dropped). `custom` tools are offered as functions taking `{"input": string}`, the way vLLM does.
"""
from __future__ import annotations

from typing import Any

import orjson

from core.errors import RlproxyError

CUSTOM_INPUT_KEY = "input"  # custom (free-form) tools take one string, as vLLM encodes them
SERVED_TOOLS = ("function", "custom")  # hosted tools (web_search, file_search, …) are OpenAI's to run: the
# engine has none, and vLLM's own route does not show them to chat-template models either, so they are left out


class UnsupportedContent(RlproxyError, ValueError):
    """A content part of a type the engine's chat route has no form for (the proxy answers 400)."""


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses input (a string, or items) as chat messages."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for item in items:
        kind = item.get("type", "message")
        previous = messages[-1] if messages and messages[-1].get("role") == "assistant" else None
        if kind in ("function_call", "custom_tool_call"):
            arguments = (item.get("arguments") or "" if kind == "function_call"
                         else orjson.dumps({CUSTOM_INPUT_KEY: item.get("input") or ""}).decode())
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": arguments}}
            if previous is not None and "tool_calls" in previous:
                previous["tool_calls"].append(call)
            elif previous is not None:
                previous["tool_calls"] = [call]
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": _tool_output(item)})
        elif kind == "reasoning":
            reasoning = _reasoning_text(item)
            if reasoning is None:
                continue
            if previous is not None and previous.get("reasoning") is None:
                previous["reasoning"] = reasoning
            else:
                messages.append({"role": "assistant", "reasoning": reasoning})
        elif item.get("role") == "assistant":
            text = assistant_text(item.get("content"))
            if previous is not None and previous.get("content") is None:
                previous["content"] = text
            else:
                messages.append({"role": "assistant", "content": text})
        else:
            messages.append({"role": item["role"], "content": _content(item.get("content"))})
    return messages


def _reasoning_text(item: dict[str, Any]) -> str | None:
    """A reasoning item's text as vLLM takes it: its first content part, else its first summary part."""
    for key in ("content", "summary"):
        parts = item.get(key)
        if isinstance(parts, list) and parts and isinstance(parts[0], dict):
            return parts[0].get("text") or ""
    return None if item.get("encrypted_content") else ""


def _tool_output(item: dict[str, Any]) -> Any:
    output = item.get("output")
    if isinstance(output, list):
        return _content(output)
    return output if isinstance(output, str) else orjson.dumps(output).decode()


def assistant_text(content: Any) -> str:
    """An assistant message item's text, as vLLM renders it: its output text and refusal parts, joined."""
    if isinstance(content, list):
        return "".join(p.get("text") or p.get("refusal") or "" for p in content if isinstance(p, dict))
    return content or ""


def _content(content: Any) -> Any:
    """Message content: a string stays a string; parts become chat parts (text, image_url)."""
    if not isinstance(content, list):
        return content
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": part.get("text") or ""})
        elif kind == "input_image":
            url = part.get("image_url") or part.get("file_id")
            parts.append({"type": "image_url", "image_url": {"url": url, "detail": part.get("detail", "auto")}})
        elif kind == "refusal":
            parts.append({"type": "text", "text": part.get("refusal") or ""})
        else:
            raise UnsupportedContent(f"unsupported content part type {kind!r}")
    if len(parts) == 1 and parts[0]["type"] == "text":
        return parts[0]["text"]
    return parts


def chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A `function` or `custom` tool as a chat function."""
    if tool.get("type") == "custom":
        parameters = {"type": "object", "properties": {CUSTOM_INPUT_KEY: {"type": "string"}},
                      "required": [CUSTOM_INPUT_KEY]}
        return {"type": "function", "function": {"name": tool["name"], "description": tool.get("description"),
                                                 "parameters": parameters}}
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
    return {"type": "function", "function": function}


def output_message(items: list[Any]) -> dict[str, Any]:
    """A Response's output items as one chat assistant message."""
    message: dict[str, Any] = {"role": "assistant", "content": None}
    calls = []
    for item in items:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            message["content"] = (message["content"] or "") + assistant_text(item.get("content"))
        elif item.get("type") in ("function_call", "custom_tool_call"):
            calls.extend(input_messages([item])[0]["tool_calls"])
    if calls:
        message["tool_calls"] = calls
    return message


def history_messages(request: dict[str, Any], response: dict[str, Any]) -> list[dict[str, Any]]:
    """One stored turn (its input and its output) as chat messages, for a later `previous_response_id`."""
    messages = input_messages(request["input"])
    message = output_message(response.get("output") or [])
    if message["content"] is not None or message.get("tool_calls"):
        messages.append(message)
    return messages


def chat_view(request: dict[str, Any] | None, response: dict[str, Any] | None
              ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """A recorded Responses call in chat form: the request's messages (`instructions` first, as the engine got
    them) and the tools it offered; the Response's output as choice 0. None for a part that cannot be read."""
    chat_request = None
    if isinstance(request, dict) and "input" in request:
        try:
            instructions = request.get("instructions")
            messages = [{"role": "system", "content": instructions}] if instructions else []
            chat_request = {"messages": messages + input_messages(request["input"]),
                            "tools": [chat_tool(t) for t in request.get("tools") or ()
                                      if isinstance(t, dict) and t.get("type") in SERVED_TOOLS]}
        except (UnsupportedContent, AttributeError, TypeError, KeyError):
            chat_request = None
    chat_response = None
    if isinstance(response, dict) and isinstance(response.get("output"), list):
        chat_response = {"choices": [{"index": 0, "message": output_message(response["output"])}]}
    return chat_request, chat_response
