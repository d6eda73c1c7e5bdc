"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`), translated to and from the
engine's chat route.

The translation follows vLLM's own `/v1/messages` (which is itself a translation to chat inside the engine), so
the prompt is the one the engine would have rendered: the system text and messages as core/messages_chat.py makes
them chat messages; `tools` as functions, `tool_choice` `any` as `required`, `stop_sequences` as `stop`;
vLLM's `chat_template_kwargs` (e.g. `{"enable_thinking": false}`) as it is; `thinking` and `output_config.effort`
as vLLM maps them (proxy/dialects/reasoning.py). The answer
is made by proxy/dialects/messages_stream.py, whole or as the event stream.

Errors on these routes use Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from core.messages_chat import chat_messages, chat_tool
from proxy.capture import CHAT, Additions
from proxy.dialects.base import engine_error_message
from proxy.dialects.checks import plainly_valid_messages
from proxy.dialects.fields import COUNT_TOKENS, refuse_unknown_anthropic
from proxy.dialects.fields import MESSAGES as KNOWN_FIELDS
from proxy.dialects.messages_objects import error_body
from proxy.dialects.messages_stream import MessagesStream
from proxy.dialects.reasoning import check_messages, messages_fields
from proxy.errors import InvalidRequest
from proxy.schemas import only_fields, validate


# The content blocks core/messages_chat.py puts into the engine's prompt (as vLLM's own /v1/messages does); any
# other (a `document`, a `search_result`, a server tool's result) would be dropped from the prompt unseen.
BLOCKS = ("text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking")


class MessagesRequest(BaseModel):
    """What the proxy checks; the other fields the API knows (proxy/dialects/fields.py) are the agent's own and
    are recorded as sent, and any other is refused (400 naming it)."""

    model_config = ConfigDict(extra="allow", json_schema_extra=only_fields(KNOWN_FIELDS))

    model: StrictStr = Field(min_length=1)
    max_tokens: StrictInt = Field(ge=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: Any = None
    stream: StrictBool | None = None
    stop_sequences: list[StrictStr] | None = None
    tools: list[dict[str, Any]] | None = None
    metadata: dict[str, Any] | None = None  # read by the translation: its `user_id`


class CountTokensRequest(BaseModel):
    model_config = ConfigDict(extra="allow", json_schema_extra=only_fields(COUNT_TOKENS))

    model: StrictStr = Field(min_length=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: Any = None
    tools: list[dict[str, Any]] | None = None


class MessagesDialect:
    translates = True
    route = "messages"
    path = "/v1/messages"
    engine_route = CHAT
    engine_path = "/v1/chat/completions"

    def validate(self, body: dict[str, Any], allowed: frozenset[str] = frozenset(),
                 model: type[BaseModel] = MessagesRequest) -> None:
        if model is not MessagesRequest or not plainly_valid_messages(body):
            validate(model, body)
        refuse_unknown_anthropic(body, (KNOWN_FIELDS if model is MessagesRequest else COUNT_TOKENS) | allowed)
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
            prefill = index == len(body["messages"]) - 1 and message.get("role") == "assistant"
            if not content and not prefill:  # as Anthropic's API refuses: only a final assistant turn may be empty
                raise InvalidRequest(f"messages.{index}.content: must not be empty (only a final assistant turn "
                                     "may be)", param=f"messages.{index}.content")
            for position, block in enumerate(content if isinstance(content, list) else ()):
                if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                    raise InvalidRequest(f"messages.{index}.content.{position}: expected a content block",
                                         param=f"messages.{index}.content.{position}")
                if block["type"] not in BLOCKS:  # it would be left out of the prompt without a word
                    raise InvalidRequest(f"messages.{index}.content.{position}: content block type "
                                         f"{block['type'][:64]!r} is not available on this engine; one of "
                                         f"{', '.join(BLOCKS)}", param=f"messages.{index}.content.{position}.type")
                if block["type"] == "text" and not block.get("text") and not prefill:
                    raise InvalidRequest(f"messages.{index}.content.{position}.text: text content blocks must be "
                                         "non-empty", param=f"messages.{index}.content.{position}.text")
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
        check_messages(body)

    # -- request ---------------------------------------------------------------------------------------
    def to_chat(self, body: dict[str, Any], history: Sequence[dict[str, Any]]) -> dict[str, Any]:
        chat: dict[str, Any] = {"model": body["model"], "messages": chat_messages(body),
                                "max_tokens": body["max_tokens"]}
        if body.get("stop_sequences"):
            chat["stop"] = body["stop_sequences"]
        for name in ("temperature", "top_p", "top_k", "chat_template_kwargs"):
            if body.get(name) is not None:
                chat[name] = body[name]
        user = (body.get("metadata") or {}).get("user_id")
        if isinstance(user, str):
            chat["user"] = user
        if body.get("tools"):
            chat["tools"] = [chat_tool(t) for t in body["tools"]]
        choice = body.get("tool_choice")
        if isinstance(choice, dict):
            chat["tool_choice"] = _chat_tool_choice(choice)
            if choice.get("disable_parallel_tool_use"):
                chat["parallel_tool_calls"] = False
        elif body.get("tools"):
            chat["tool_choice"] = "auto"
        response_format = _response_format(body)
        if response_format is not None:
            chat["response_format"] = response_format
        chat.update(messages_fields(body))
        if body.get("stream"):
            chat["stream"] = True
        return chat

    # -- response --------------------------------------------------------------------------------------
    def translator(self, body: dict[str, Any], call_id: str, created: int, additions: Additions) -> MessagesStream:
        return MessagesStream(body, call_id)

    def engine_error(self, status: int, raw: bytes) -> bytes:
        message, _ = engine_error_message(raw)
        return orjson.dumps(error_body(status, message))


def _chat_tool_choice(choice: dict[str, Any]) -> Any:
    kind = choice.get("type")
    if kind == "tool" and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    return {"any": "required", "none": "none"}.get(kind, "auto")


def _response_format(body: dict[str, Any]) -> dict[str, Any] | None:
    """Structured output (`output_config.format`, or the beta's earlier top-level `output_format`: a JSON schema
    the answer must follow) as the chat route's `response_format`, named as vLLM's own /v1/messages names it: left
    out, the agent that asked for JSON got whatever text the model wrote, and the call was recorded as sampled
    without the constraint."""
    config = body.get("output_config")
    fmt = (config.get("format") if isinstance(config, dict) else None) or body.get("output_format")
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        return None
    return {"type": "json_schema", "json_schema": {"name": "json_schema", "schema": fmt["schema"]}}


MESSAGES = MessagesDialect()
