"""Wire formats other than Chat Completions, translated to and from the engine's chat route.

Every policy call goes to the engine as a Chat Completions request, whatever API the agent speaks, because that
is the one route on which every engine returns the exact prompt and completion token ids and the sampling
logprobs, streamed chunk by chunk (vLLM 0.32's `/v1/messages` returns no ids at all; its `/v1/responses` returns
them only when asked with `enable_response_messages`, and keeps no state for `previous_response_id` unless its
response store is turned on). So each dialect is pure translation, with no I/O, over the one capture core in
`proxy/serving.py`:

    request   the agent's body  -> a chat body (`to_chat`)
    response  the chat answer   -> the agent's format (`build_response`), or chunk by chunk (`stream`)
    errors    the proxy's errors and the engine's -> the agent's error shape

`responses` is the OpenAI Responses API, `messages` Anthropic's Messages API; `chat_view` gives AIR the chat
form of any recorded call, so automatic rewards do not care which API a call came through.
"""
from __future__ import annotations

from typing import Any

from proxy.dialects.base import Dialect, Output, StreamTranslator
from proxy.dialects.messages import MESSAGES
from proxy.dialects.responses import RESPONSES

DIALECTS: dict[str, Dialect] = {d.route: d for d in (RESPONSES, MESSAGES)}


def chat_view(route: str, request: dict[str, Any] | None, response: dict[str, Any] | None
              ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """A recorded call's request and response in chat form (what AIR reads); chat calls are returned as they are."""
    dialect = DIALECTS.get(route)
    if dialect is None:
        return request, response
    return dialect.chat_view(request, response)

__all__ = ["DIALECTS", "Dialect", "MESSAGES", "Output", "RESPONSES", "StreamTranslator", "chat_view"]
