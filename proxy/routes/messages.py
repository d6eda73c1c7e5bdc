"""Anthropic Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`, under the same prefixes as
chat. Errors on these routes are in Anthropic's shape (the error middleware knows these paths)."""
from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from proxy.bodies import Message, TokenCount
from core.messages_chat import chat_messages
from proxy.context import call_context
from proxy.dialects.messages import MESSAGES, CountTokensRequest, MessagesRequest
from proxy.dialects.reasoning import messages_fields
from proxy.api import API_ERRORS, Answer, Endpoint, PREFIXES, mounted
from proxy.schemas import parse_json_object
from proxy.state import state

SUFFIXES = ("/v1/messages", "/v1/messages/count_tokens")


def in_messages_api(path: str) -> bool:
    """A path of Anthropic's Messages API (served or not: `/v1/messages/batches` too), whose errors an Anthropic
    client reads in that API's shape."""
    return path.endswith(SUFFIXES[0]) or f"{SUFFIXES[0]}/" in path


async def create_message(request: web.Request) -> web.StreamResponse:
    return await state(request).serving[MESSAGES.route].handle(request)


async def count_tokens(request: web.Request) -> web.Response:
    """The prompt's length as the engine tokenizes the same chat rendering it would serve (`/tokenize`)."""
    body = parse_json_object(await request.read())
    context = call_context(request)
    app = state(request)
    app.boundary.check_common(body)
    MESSAGES.validate(body, app.boundary.allowed, CountTokensRequest)
    extra = {}
    if arguments := template_arguments(body):
        extra["chat_template_kwargs"] = arguments
    if body.get("tools"):
        extra["tools"] = MESSAGES.to_chat({**body, "max_tokens": 1}, [])["tools"]
    status, raw = await app.serving[MESSAGES.route].count_tokens(body["model"], chat_messages(body), context,
                                                                 **extra)
    if status != 200:
        return web.Response(body=MESSAGES.engine_error(status, raw), status=status, content_type="application/json")
    return TokenCount(input_tokens=int(orjson.loads(raw)["count"])).reply()


def template_arguments(body: dict[str, Any]) -> dict[str, Any]:
    """The template arguments vLLM's chat route renders the same body's `/v1/messages` call with. That call sends
    `thinking` and `output_config.effort` as `reasoning_effort` (proxy/dialects/reasoning.py), which the chat route
    turns into the template's `reasoning_effort` and `enable_thinking` (vllm/entrypoints/openai/chat_completion/
    protocol.py `build_chat_params`); `/tokenize` takes no `reasoning_effort`, so without these the count would
    be of another prompt: Qwen3's template adds an empty think block when thinking is off."""
    arguments = dict(body.get("chat_template_kwargs") or {})  # an object: checked by the boundary
    effort = messages_fields(body).get("reasoning_effort")
    if effort is not None:
        arguments["reasoning_effort"] = effort  # vLLM: the request's own field over the caller's argument
        arguments.setdefault("enable_thinking", effort != "none")  # vLLM: only when the caller did not set it
    return arguments


USER = [{"role": "user", "content": "What is 6*7?"}]
ENDPOINTS = mounted([
    Endpoint("post", "/v1/messages", create_message, "Anthropic Messages API",
             {200: Answer("The answer (events when `stream` is true).", Message, stream=True, call_id=True)},
             API_ERRORS, body=MessagesRequest, engine_errors=True, anthropic=True, context_headers=True,
             example=lambda model: {"model": model, "max_tokens": 64, "messages": USER}),
    Endpoint("post", "/v1/messages/count_tokens", count_tokens, "Anthropic token counting (the engine's count)",
             {200: Answer("Tokens.", TokenCount)}, API_ERRORS, body=CountTokensRequest, engine_errors=True,
             anthropic=True, context_headers=True, example=lambda model: {"model": model, "messages": USER}),
], PREFIXES)
