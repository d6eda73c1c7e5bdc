"""The OpenAI Responses API (`POST /v1/responses`), translated to and from the engine's chat route.

The translation follows vLLM's own Responses route for chat-template models, so the engine sees the prompt it
would have built itself: `instructions` become the system message, the input items the chat messages that
core/responses_chat.py makes of them; sampling fields carry over, `max_output_tokens` becomes `max_tokens`, a
`text.format` the `response_format`, `reasoning.effort` and `truncation` what vLLM makes of them
(proxy/dialects/reasoning.py). `custom` tools are offered as functions taking `{"input": string}`, the way
vLLM does, and their calls come back as `custom_tool_call` items. The answer is made by
proxy/dialects/responses_stream.py, whole or as the event stream.

`previous_response_id` is resolved by the proxy from its own records (`history`: the earlier turns' input and
output as chat messages), so conversation state survives engine restarts and works across proxy replicas.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator

from core.responses_chat import SERVED_TOOLS, UnsupportedContent, chat_tool, input_messages
from proxy.capture import CHAT, Additions
from proxy.dialects.base import openai_engine_error
from proxy.dialects.checks import plainly_valid_responses
from proxy.dialects.fields import RESPONSES as KNOWN_FIELDS
from proxy.dialects.fields import refuse_unknown_openai
from proxy.dialects.reasoning import check_responses, responses_fields
from proxy.dialects.responses_objects import wants_logprobs
from proxy.dialects.responses_stream import ResponsesStream
from proxy.errors import InvalidRequest
from proxy.schemas import only_fields, validate

# Sampling fields the Responses API shares with chat, and vLLM's own extensions, passed on as they are.
SAMPLING = ("temperature", "top_p", "user", "parallel_tool_calls", "seed", "top_k", "min_p", "repetition_penalty",
            "presence_penalty", "frequency_penalty", "stop", "service_tier", "top_logprobs", "chat_template_kwargs",
            "logit_bias", "stop_token_ids", "include_stop_str_in_output", "skip_special_tokens", "ignore_eos")


class ResponsesRequest(BaseModel):
    """What the proxy checks; the other fields the API knows (proxy/dialects/fields.py) are the agent's own and
    are recorded as sent, and any other is refused (400 naming it)."""

    model_config = ConfigDict(extra="allow", json_schema_extra=only_fields(KNOWN_FIELDS))

    model: StrictStr = Field(min_length=1)
    input: Any
    instructions: StrictStr | None = None
    stream: StrictBool | None = None
    store: StrictBool | None = None
    background: StrictBool | None = None
    previous_response_id: StrictStr | None = None
    tools: list[dict[str, Any]] | None = None
    max_output_tokens: StrictInt | None = Field(None, ge=1)
    text: dict[str, Any] | None = None  # read by the translation: its `format`
    include: list[Any] | None = None

    @field_validator("input")
    @classmethod
    def _input(cls, value: Any) -> Any:
        if isinstance(value, str) or (isinstance(value, list) and value):
            return value
        raise ValueError("expected a string or a non-empty list of input items")


class ResponsesDialect:
    translates = True
    route = "responses"
    path = "/v1/responses"
    engine_route = CHAT
    engine_path = "/v1/chat/completions"

    def validate(self, body: dict[str, Any], allowed: frozenset[str] = frozenset()) -> None:
        if not plainly_valid_responses(body):
            validate(ResponsesRequest, body)
        refuse_unknown_openai(body, KNOWN_FIELDS | allowed)
        if body.get("background"):
            raise InvalidRequest("background responses are not supported: the proxy answers while it records",
                                 param="background", code="unsupported_parameter")
        check_responses(body)
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
    def to_chat(self, body: dict[str, Any], history: Sequence[dict[str, Any]]) -> dict[str, Any]:
        messages: list[dict[str, Any]] = []
        if body.get("instructions"):
            messages.append({"role": "system", "content": body["instructions"]})
        # earlier turns as they were, their system and developer input items included (OpenAI carries input items
        # over; only `instructions` do not carry, and the stored turns never hold them: core/responses_chat.py)
        messages += history
        try:
            messages += input_messages(body["input"])
        except UnsupportedContent as exc:
            raise InvalidRequest(str(exc), param="input") from None
        chat: dict[str, Any] = {"model": body["model"], "messages": messages}
        for name in SAMPLING:
            if body.get(name) is not None:
                chat[name] = body[name]
        if body.get("max_output_tokens") is not None:
            chat["max_tokens"] = body["max_output_tokens"]
        chat.update(responses_fields(body))
        if body.get("stream"):
            chat["stream"] = True
        tools = [chat_tool(t) for t in body.get("tools") or () if t.get("type") in SERVED_TOOLS]
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
    def translator(self, body: dict[str, Any], call_id: str, created: int, additions: Additions) -> ResponsesStream:
        return ResponsesStream(body, call_id, created)

    def engine_error(self, status: int, raw: bytes) -> bytes:
        return openai_engine_error(status, raw)


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


RESPONSES = ResponsesDialect()
