"""The OpenAI Responses API (`POST /v1/responses`), translated to and from the engine's chat route.

The translation follows vLLM's own Responses route for chat-template models, so the engine sees the prompt it
would have built itself: `instructions` become the system message; message items keep their role (`developer`
too) and content; consecutive `function_call` items join the assistant message before them as `tool_calls`;
`function_call_output` items become `tool` messages; a reasoning item's text becomes the `reasoning` of the
assistant message before it (or of a new one: the turn is rendered even with no text; encrypted reasoning, which
this engine cannot have written, is dropped). `custom` tools are offered as
functions taking `{"input": string}`, the way vLLM does, and their calls come back as `custom_tool_call` items.

`previous_response_id` is resolved by the proxy from its own records (`history`: the earlier turns' input and
output as chat messages), so conversation state survives engine restarts and works across proxy replicas.
"""
from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator

from proxy.dialects import fields
from proxy.dialects.base import Output, imported_later, openai_engine_error
from proxy.dialects.checks import plainly_valid_responses
from proxy.errors import InvalidRequest
from proxy.schemas import validate

CUSTOM_INPUT_KEY = "input"  # custom (free-form) tools take one string, as vLLM encodes them
# Sampling fields the Responses API shares with chat, and vLLM's own extensions, passed on as they are.
SAMPLING = ("temperature", "top_p", "user", "parallel_tool_calls", "seed", "top_k", "min_p", "repetition_penalty",
            "presence_penalty", "frequency_penalty", "stop", "service_tier", "top_logprobs")
# The stream module imports this one: it is imported on first use.
_stream_type = imported_later("proxy.dialects.responses_stream", "ResponsesStream")
SERVED_TOOLS = ("function", "custom")  # hosted tools (web_search, file_search, …) are OpenAI's to run: the
# engine has none, and vLLM's own route does not show them to chat-template models either, so they are left out


class ResponsesRequest(BaseModel):
    """What the proxy checks; the other fields the API knows (proxy/dialects/fields.py) are the agent's own and
    are recorded as sent, and any other is refused (400 naming it)."""

    model_config = ConfigDict(extra="allow")

    model: StrictStr = Field(min_length=1)
    input: Any
    instructions: StrictStr | None = None
    stream: StrictBool | None = None
    store: StrictBool | None = None
    background: StrictBool | None = None
    previous_response_id: StrictStr | None = None
    tools: list[dict[str, Any]] | None = None
    max_output_tokens: StrictInt | None = Field(None, ge=1)

    @field_validator("input")
    @classmethod
    def _input(cls, value: Any) -> Any:
        if isinstance(value, str) or (isinstance(value, list) and value):
            return value
        raise ValueError("expected a string or a non-empty list of input items")


class ResponsesDialect:
    route = "responses"
    path = "/v1/responses"

    def validate(self, body: dict[str, Any]) -> None:
        if not plainly_valid_responses(body):
            validate(ResponsesRequest, body)
        fields.refuse_unknown_openai(body, fields.RESPONSES)
        if body.get("background"):
            raise InvalidRequest("background responses are not supported: the proxy answers while it records",
                                 param="background", code="unsupported_parameter")
        for index, tool in enumerate(body.get("tools") or ()):
            kind = tool.get("type")
            if kind in ("function", "custom") and not isinstance(tool.get("name"), str):
                raise InvalidRequest(f"tools[{index}].name: required", param=f"tools.{index}.name")
            if not isinstance(kind, str):
                raise InvalidRequest(f"tools[{index}].type: required", param=f"tools.{index}.type")
        if isinstance(body["input"], list):
            for index, item in enumerate(body["input"]):
                _check_item(item, index)

    # -- request ---------------------------------------------------------------------------------------
    def to_chat(self, body: dict[str, Any], history: list[dict[str, Any]]) -> dict[str, Any]:
        messages: list[dict[str, Any]] = []
        if body.get("instructions"):
            messages.append({"role": "system", "content": body["instructions"]})
        messages += [m for m in history if m.get("role") != "system"]  # instructions never carry over
        messages += input_messages(body["input"])
        chat: dict[str, Any] = {"model": body["model"], "messages": messages}
        for name in SAMPLING:
            if body.get(name) is not None:
                chat[name] = body[name]
        if body.get("max_output_tokens") is not None:
            chat["max_tokens"] = body["max_output_tokens"]
        if body.get("stream"):
            chat["stream"] = True
        tools = [_chat_tool(t) for t in body.get("tools") or () if t.get("type") in SERVED_TOOLS]
        if tools:
            chat["tools"] = tools
            chat["tool_choice"] = _chat_tool_choice(body.get("tool_choice", "auto"))
        response_format = _response_format((body.get("text") or {}).get("format"))
        if response_format is not None:
            chat["response_format"] = response_format
        if wants_logprobs(body):
            chat["logprobs"] = True
        return chat

    # -- response --------------------------------------------------------------------------------------
    def build_response(self, body: dict[str, Any], output: Output, call_id: str, created: int) -> dict[str, Any]:
        return finished(skeleton(body, call_id, created), output, output_items(body, output, call_id))

    def stream(self, body: dict[str, Any], call_id: str, created: int):
        return _stream_type()(self, body, call_id, created)

    def engine_error(self, status: int, raw: bytes) -> bytes:
        return openai_engine_error(status, raw)

    def chat_view(self, request: dict[str, Any] | None, response: dict[str, Any] | None):
        chat_request = None
        if isinstance(request, dict) and "input" in request:
            try:
                chat_request = {"messages": input_messages(request["input"]),
                                "tools": [_chat_tool(t) for t in request.get("tools") or ()
                                          if isinstance(t, dict) and t.get("type") in SERVED_TOOLS]}
            except (InvalidRequest, AttributeError, TypeError, KeyError):
                chat_request = None
        chat_response = None
        if isinstance(response, dict) and isinstance(response.get("output"), list):
            message = output_message(response["output"])
            chat_response = {"choices": [{"index": 0, "message": message}]}
        return chat_request, chat_response


def wants_logprobs(body: dict[str, Any]) -> bool:
    return "message.output_text.logprobs" in (body.get("include") or ())


def _check_item(item: Any, index: int) -> None:
    if not isinstance(item, dict):
        raise InvalidRequest(f"input[{index}]: expected an object", param=f"input.{index}")
    kind = item.get("type", "message")
    if kind == "message":
        if item.get("role") not in ("user", "assistant", "system", "developer"):
            raise InvalidRequest(f"input[{index}].role: expected user, assistant, system or developer",
                                 param=f"input.{index}.role")
    elif kind in ("function_call", "custom_tool_call"):
        if not isinstance(item.get("call_id"), str) or not isinstance(item.get("name"), str):
            raise InvalidRequest(f"input[{index}]: a {kind} needs call_id and name", param=f"input.{index}")
    elif kind in ("function_call_output", "custom_tool_call_output"):
        if not isinstance(item.get("call_id"), str):
            raise InvalidRequest(f"input[{index}]: a {kind} needs call_id", param=f"input.{index}.call_id")
    elif kind == "item_reference":
        raise InvalidRequest(f"input[{index}]: item references are not supported; send the item itself",
                             param=f"input.{index}", code="unsupported_parameter")
    elif kind != "reasoning":
        raise InvalidRequest(f"input[{index}]: unsupported input item type {kind!r}", param=f"input.{index}.type")


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
            text = _assistant_text(item.get("content"))
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


def _assistant_text(content: Any) -> str:
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
            raise InvalidRequest(f"unsupported content part type {kind!r}", param="input")
    if len(parts) == 1 and parts[0]["type"] == "text":
        return parts[0]["text"]
    return parts


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    if tool.get("type") == "custom":
        parameters = {"type": "object", "properties": {CUSTOM_INPUT_KEY: {"type": "string"}},
                      "required": [CUSTOM_INPUT_KEY]}
        return {"type": "function", "function": {"name": tool["name"], "description": tool.get("description"),
                                                 "parameters": parameters}}
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom") and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        return choice.get("mode", "auto")
    return choice if choice in ("auto", "required", "none") else "auto"


def _response_format(fmt: Any) -> dict[str, Any] | None:
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt["type"] == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    return {"type": fmt["type"]}


# -- the Response object ---------------------------------------------------------------------------------
def response_id(call_id: str) -> str:
    return f"resp_{call_id}"


def skeleton(body: dict[str, Any], call_id: str, created: int) -> dict[str, Any]:
    """The Response object without its output: what `response.created` carries, and what the final one starts
    from. It echoes the request's settings, as the API does."""
    return {
        "id": response_id(call_id), "object": "response", "created_at": created, "status": "in_progress",
        "background": False, "error": None, "incomplete_details": None,
        "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": body.get("max_tool_calls"), "model": body["model"], "output": [],
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
        "service_tier": body.get("service_tier") or "auto", "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0), "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
        "top_logprobs": body.get("top_logprobs"), "top_p": body.get("top_p", 1.0), "truncation": "disabled",
        "usage": None, "user": body.get("user"), "metadata": body.get("metadata") or {},
    }


def usage(output: Output) -> dict[str, Any]:
    return {"input_tokens": output.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": output.prompt_tokens + output.completion_tokens}


def finished(response: dict[str, Any], output: Output, items: list[dict[str, Any]]) -> dict[str, Any]:
    """A `skeleton` completed with its output `items`, status and usage: the Response the agent receives."""
    incomplete = output.finish_reason == "length"
    response["output"] = items
    response["status"] = "incomplete" if incomplete else "completed"
    response["incomplete_details"] = {"reason": "max_output_tokens"} if incomplete else None
    response["usage"] = usage(output)
    return response


def message_item(call_id: str, part: dict[str, Any], status: str) -> dict[str, Any]:
    """The assistant message item holding one `text_part`."""
    return {"id": f"msg_{call_id}", "type": "message", "status": status, "role": "assistant", "content": [part]}


def text_part(text: str, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": response_logprobs(logprobs)}


def response_logprobs(entries: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Chat logprobs entries in the Responses form (the same fields, nested top_logprobs without `bytes` lists
    of their own kept as they came)."""
    return [{"token": e.get("token"), "logprob": e.get("logprob"), "bytes": e.get("bytes") or [],
             "top_logprobs": [{"token": t.get("token"), "logprob": t.get("logprob"), "bytes": t.get("bytes") or []}
                              for t in e.get("top_logprobs") or ()]}
            for e in entries or ()]


def tool_item(body: dict[str, Any], call_id: str, index: int, call: dict[str, Any], status: str) -> dict[str, Any]:
    """A chat tool call as a `function_call` item, or a `custom_tool_call` for a custom tool's name."""
    function = call.get("function") or {}
    name, arguments = function.get("name") or "", function.get("arguments") or ""
    item_id, tool_call_id = f"fc_{call_id}_{index}", call.get("id") or f"call_{call_id}_{index}"
    if name in custom_tool_names(body):
        return {"id": item_id, "type": "custom_tool_call", "status": status, "call_id": tool_call_id,
                "name": name, "input": custom_input(arguments)}
    return {"id": item_id, "type": "function_call", "status": status, "call_id": tool_call_id, "name": name,
            "arguments": arguments}


def custom_tool_names(body: dict[str, Any]) -> set[str]:
    return {t.get("name") for t in body.get("tools") or () if isinstance(t, dict) and t.get("type") == "custom"}


def custom_input(arguments: str) -> str:
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    value = parsed.get(CUSTOM_INPUT_KEY) if isinstance(parsed, dict) else None
    return value if isinstance(value, str) else arguments


def reasoning_item(call_id: str, text: str) -> dict[str, Any]:
    return {"id": f"rs_{call_id}", "type": "reasoning", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}], "status": "completed"}


def output_items(body: dict[str, Any], output: Output, call_id: str) -> list[dict[str, Any]]:
    items = []
    if output.reasoning:
        items.append(reasoning_item(call_id, output.reasoning))
    if output.text or not output.tool_calls:
        status = "incomplete" if output.finish_reason == "length" else "completed"
        logprobs = output.logprobs if wants_logprobs(body) else None  # the proxy asks for them on its own
        items.append(message_item(call_id, text_part(output.text or "", logprobs), status))
    items += [tool_item(body, call_id, i, call, "completed") for i, call in enumerate(output.tool_calls)]
    return items


def output_message(items: list[Any]) -> dict[str, Any]:
    """A Response's output items as one chat assistant message (for history and for AIR)."""
    message: dict[str, Any] = {"role": "assistant", "content": None}
    calls = []
    for item in items:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            message["content"] = (message["content"] or "") + _assistant_text(item.get("content"))
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



RESPONSES = ResponsesDialect()
