"""OpenAI-compatible routes, also mounted under /rollouts/{rollout_id}[/agents/{agent}] so that changing only
`base_url` is enough to track a rollout."""
from __future__ import annotations

import aiohttp
from aiohttp import web

from proxy.capture import CHAT, COMPLETIONS
from proxy.context import call_context
from proxy.errors import UpstreamUnavailable
from proxy.state import state

PREFIXES = ("", "/rollouts/{rollout_id}", "/rollouts/{rollout_id}/agents/{agent}")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await state(request).serving.handle(request, CHAT)


async def completions(request: web.Request) -> web.StreamResponse:
    return await state(request).serving.handle(request, COMPLETIONS)


async def models(request: web.Request) -> web.Response:
    """The engine's model list, as the engine answers it."""
    call_context(request)  # validates ids in the path
    upstreams = state(request).upstreams
    replica = upstreams.choose(request.match_info.get("rollout_id"))
    try:
        async with upstreams.session.get(replica.url + "/v1/models") as upstream:
            return web.Response(body=await upstream.read(), status=upstream.status,
                                content_type=upstream.content_type)
    except (aiohttp.ClientError, OSError) as exc:
        raise UpstreamUnavailable(f"engine unreachable: {exc}") from exc


def add_routes(app: web.Application) -> None:
    for prefix in PREFIXES:
        app.router.add_post(prefix + "/v1/chat/completions", chat_completions)
        app.router.add_post(prefix + "/v1/completions", completions)
        app.router.add_get(prefix + "/v1/models", models)
