"""The Gemini API's conversation in chat form: `systemInstruction` and `contents` as chat messages, function
declarations as chat functions, a candidate's content as the assistant's chat message. The proxy builds the
engine's prompt with it (proxy/dialects/gemini.py), and automatic rewards and the judge read recorded calls with
it (core/chat_view.py).

No engine serves the Gemini API itself, so there is no engine translation to follow; this one keeps what the
model sees as close to the other dialects' as the formats allow: the system instruction's text parts joined by
newlines, a `user` turn's text and images as chat parts, a `model` turn's `functionCall` parts as the assistant's
`tool_calls` (args as JSON text, written as Python's `json.dumps` writes them, as the Messages translation does),
its `thought` parts as the message's `reasoning`, and each `functionResponse` part as a `tool` message whose
content is its `response` object as JSON (automatic rewards read `{"error": …}` there as a tool error).

Gemini's function calls need not carry ids; chat's tool messages must name the call they answer. A call without
one gets `call_<turn>_<part>`, and a response without one answers the earliest unanswered call of its name, so the
same conversation always renders the same prompt.
"""
from __future__ import annotations

import json
from typing import Any

from core.messages_chat import chat_turn

RAW_ARGS = "_raw"  # the key a function call's arguments that are not a JSON object are kept under in `args`
GEMINI_TYPES = frozenset({"STRING", "NUMBER", "INTEGER", "BOOLEAN", "ARRAY", "OBJECT", "NULL"})


def json_text(value: Any) -> str:
    return json.dumps(value)


def system_text(instruction: Any) -> str:
    """`systemInstruction` (a Content, or a bare string as the SDKs also take it) as one text."""
    if isinstance(instruction, str):
        return instruction
    if not isinstance(instruction, dict):
        return ""
    return "\n".join(part["text"] for part in instruction.get("parts") or ()
                     if isinstance(part, dict) and isinstance(part.get("text"), str) and not part.get("thought"))


def call_id(turn: int, position: int, call: dict[str, Any]) -> str:
    return call["id"] if isinstance(call.get("id"), str) and call["id"] else f"call_{turn}_{position}"


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request as chat messages (the system instruction first)."""
    messages: list[dict[str, Any]] = []
    system = system_text(body.get("systemInstruction"))
    if system:
        messages.append({"role": "system", "content": system})
    pending: list[tuple[str, str]] = []  # (name, id) of calls not answered yet, oldest first
    for turn, content in enumerate(body.get("contents") or ()):
        role = "assistant" if content.get("role") == "model" else "user"
        parts: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        thinking: list[str] = []
        for position, part in enumerate(content.get("parts") or ()):
            if isinstance(part.get("text"), str):
                if part.get("thought"):
                    if role == "assistant":
                        thinking.append(part["text"])
                elif part["text"]:
                    parts.append({"type": "text", "text": part["text"]})
            elif isinstance(part.get("inlineData"), dict):
                data = part["inlineData"]
                parts.append({"type": "image_url", "image_url": {
                    "url": f"data:{data.get('mimeType', 'image/png')};base64,{data.get('data', '')}"}})
            elif isinstance(part.get("fileData"), dict):
                parts.append({"type": "image_url", "image_url": {"url": part["fileData"].get("fileUri") or ""}})
            elif isinstance(part.get("functionCall"), dict) and role == "assistant":
                call = part["functionCall"]
                identity = call_id(turn, position, call)
                pending.append((call.get("name") or "", identity))
                calls.append({"id": identity, "type": "function",
                              "function": {"name": call.get("name") or "", "arguments": _arguments(call)}})
            elif isinstance(part.get("functionResponse"), dict):
                answer = part["functionResponse"]
                messages.append({"role": "tool", "tool_call_id": _answered(answer, pending, turn, position),
                                 "content": json_text(answer.get("response") or {})})
        if role == "user" and not parts:
            continue  # only function responses (now `tool` messages): no user turn
        messages.append(chat_turn(role, parts, calls, thinking))
    return messages


def _answered(answer: dict[str, Any], pending: list[tuple[str, str]], turn: int, position: int) -> str:
    """The id of the call a functionResponse answers: its own id, else the earliest unanswered call of its name."""
    if isinstance(answer.get("id"), str) and answer["id"]:
        pending[:] = [p for p in pending if p[1] != answer["id"]]
        return answer["id"]
    name = answer.get("name") or ""
    for index, (called, identity) in enumerate(pending):
        if called == name:
            del pending[index]
            return identity
    return f"call_{turn}_{position}"


def _arguments(call: dict[str, Any]) -> str:
    """The text the model wrote for a call (undoing the `_raw` that keeps a malformed one whole)."""
    args = call.get("args")
    if isinstance(args, dict) and list(args) == [RAW_ARGS] and isinstance(args[RAW_ARGS], str):
        return args[RAW_ARGS]
    return json_text(args if args is not None else {})


def json_schema(schema: Any) -> Any:
    """Gemini's Schema (OpenAPI's subset, its types in capitals: `OBJECT`) as JSON Schema (`object`); other keys
    as they are."""
    if isinstance(schema, list):
        return [json_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str) and value.upper() in GEMINI_TYPES:
            out[key] = value.lower()
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: json_schema(item) for name, item in value.items()}
        elif key in ("items", "anyOf", "oneOf", "allOf", "additionalProperties", "not"):
            out[key] = json_schema(value)
        else:
            out[key] = value
    return out


def chat_tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every function declaration of `tools` as a chat function (`parametersJsonSchema` as it is, `parameters`
    as JSON Schema)."""
    out = []
    for tool in body.get("tools") or ():
        for declaration in tool.get("functionDeclarations") or () if isinstance(tool, dict) else ():
            if not isinstance(declaration, dict):
                continue
            parameters = declaration.get("parametersJsonSchema")
            if parameters is None and declaration.get("parameters") is not None:
                parameters = json_schema(declaration["parameters"])
            function: dict[str, Any] = {"name": declaration.get("name"),
                                        "description": declaration.get("description")}
            if parameters is not None:
                function["parameters"] = parameters
            out.append({"type": "function", "function": function})
    return out


def assistant_message(content: Any) -> dict[str, Any]:
    """A candidate's content as one chat assistant message (its text, and its function calls as tool calls)."""
    parts = [p for p in (content.get("parts") or () if isinstance(content, dict) else ()) if isinstance(p, dict)]
    text = "".join(p["text"] for p in parts if isinstance(p.get("text"), str) and not p.get("thought"))
    calls = [{"id": call_id(0, position, p["functionCall"]), "type": "function",
              "function": {"name": p["functionCall"].get("name"), "arguments": _arguments(p["functionCall"])}}
             for position, p in enumerate(parts) if isinstance(p.get("functionCall"), dict)]
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return message


def chat_view(request: dict[str, Any] | None, response: dict[str, Any] | None
              ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """A recorded Gemini call in chat form: the request's messages and the functions it offered; each candidate's
    content as a choice. None for a part that cannot be read."""
    chat_request = None
    if isinstance(request, dict) and isinstance(request.get("contents"), list):
        try:
            chat_request = {"messages": chat_messages(request), "tools": chat_tools(request)}
        except (AttributeError, TypeError, KeyError):
            chat_request = None
    chat_response = None
    if isinstance(response, dict) and isinstance(response.get("candidates"), list):
        chat_response = {"choices": [{"index": position, "message": assistant_message(candidate.get("content"))}
                                     for position, candidate in enumerate(response["candidates"])
                                     if isinstance(candidate, dict)]}
    return chat_request, chat_response
