"""OpenAI-compatible routes, also mounted under /rollouts/{rollout_id}[/agents/{agent}] so that changing only
`base_url` is enough to track a rollout."""
from __future__ import annotations

import orjson
from aiohttp import web

from proxy.bodies import EngineObject
from proxy.capture import CHAT, COMPLETIONS
from proxy.context import call_context
from proxy.dialects.chat import ChatCompletionRequest, CompletionRequest
from proxy.api import API_ERRORS, Answer, Endpoint, PREFIXES, RECORDED, mounted
from proxy.errors import UpstreamUnavailable, json_response
from proxy.state import state



async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await state(request).serving[CHAT].handle(request)


async def completions(request: web.Request) -> web.StreamResponse:
    return await state(request).serving[COMPLETIONS].handle(request)


async def models(request: web.Request) -> web.Response:
    """The engine's model list, as the engine answers it; for a project's key, only the models it may call."""
    context = call_context(request)  # validates ids in the path
    app = state(request)
    status, raw, content_type = await app.upstreams.model_list(request.match_info.get("rollout_id"))
    if context.project is not None and status == 200:
        try:
            listing = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise UpstreamUnavailable("engine returned an invalid model list") from None
        if isinstance(listing, dict):
            return json_response(await app.access.visible(listing, context.project))
    return web.Response(body=raw, status=status, content_type=content_type)


ENGINE_ANSWER = Answer("The engine's answer, as the engine sent it (SSE when `stream` is true).", EngineObject,
                       stream=True, call_id=True)

ENDPOINTS = mounted([
    Endpoint("post", "/v1/chat/completions", chat_completions, "OpenAI chat completions", {200: ENGINE_ANSWER},
             API_ERRORS, body=ChatCompletionRequest, engine_errors=True, context_headers=True,
             example=lambda model: {"model": model, "messages": [{"role": "user", "content": "What is 6*7?"}]}),
    Endpoint("post", "/v1/completions", completions, "OpenAI completions", {200: ENGINE_ANSWER}, API_ERRORS,
             body=CompletionRequest, engine_errors=True, context_headers=True,
             example=lambda model: {"model": model, "prompt": "6*7 ="}),
    Endpoint("get", "/v1/models", models, "The engine's model list (a project's key: the models it may call)",
             {200: Answer("The engine's model list.", EngineObject)}, (400, 404, 502), engine_errors=True,
             context_headers=True),
], PREFIXES, RECORDED)
