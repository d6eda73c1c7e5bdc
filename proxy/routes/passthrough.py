"""Every engine route the proxy does not own (`/v1/embeddings`, `/tokenize`, `/detokenize`, `/v1/rerank`,
`/v1/score`, `/pooling`, audio, …) is relayed to the rollout's engine replica byte for byte, streamed bodies
included, also under the `/rollouts/{id}[/agents/{agent}]` prefixes. Such calls are counted in metrics
(`rlproxy_passthrough_requests_total`), never recorded or trained on. A path or method the engine has no route
for either gets the proxy's own error, which names it (errors keep the route's shape everywhere).

The engine's administration routes are not relayed: adapters are loaded and unloaded by the proxy's policy
lifecycle alone, so an agent cannot change what the engine serves. The agent's own `Authorization` header is
never passed on; the engines get the proxy's key."""
from __future__ import annotations

import asyncio
import re

import aiohttp
import orjson
from aiohttp import web

from proxy.context import call_context
from proxy.errors import NotFoundError, UpstreamTimeout, UpstreamUnavailable
from proxy.state import state

ADMIN = re.compile(r"^/(v1/)?(load_lora_adapter|unload_lora_adapter|reset_prefix_cache|reset_mm_cache|"
                   r"reset_encoder_cache|sleep|wake_up|is_sleeping|collective_rpc|start_profile|stop_profile|"
                   r"scale_elastic_ep|is_scaling_elastic_ep|update_weights|init_weights_update_group|pause|resume|"
                   r"server_info)\b")
# Hop-by-hop headers (RFC 9110 §7.6.1) and what the proxy sets itself are not copied across.
DROPPED = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
           "transfer-encoding", "upgrade", "host", "content-length", "authorization", "x-api-key"}
KNOWN = ("/v1/embeddings", "/v1/rerank", "/v1/score", "/v1/audio/transcriptions", "/v1/audio/translations",
         "/v1/classify", "/tokenize", "/detokenize", "/pooling", "/rerank", "/score", "/classify", "/health",
         "/version", "/ping", "/v1/responses", "/v1/messages")


OWN = {"rollouts", "reward", "policies", "healthz", "readyz", "metrics", "openapi.json"}


async def passthrough(request: web.Request) -> web.StreamResponse:
    path = "/" + request.match_info["tail"]
    if path == request.path and path.split("/")[1] in OWN:  # the proxy's own namespace: never the engine's
        raise NotFoundError(f"no route {request.method} {request.path} on this proxy")
    if ADMIN.match(path):
        raise NotFoundError(f"no route {request.method} {request.path} on this proxy (engine administration is "
                            "not exposed to agents)")
    context = call_context(request)  # validates the ids in a prefixed path
    app = state(request)
    replica = app.upstreams.choose(context.rollout_id)
    headers = {k: v for k, v in request.headers.items() if k.lower() not in DROPPED}
    label = path if path in KNOWN else "other"
    try:
        upstream = await app.upstreams.session.request(
            request.method, replica.url + path, params=request.rel_url.query, data=await request.read(),
            headers=headers, allow_redirects=False)
    except asyncio.TimeoutError:
        raise UpstreamTimeout("engine did not answer in time") from None
    except (aiohttp.ClientError, OSError) as exc:
        app.upstreams.mark(replica, ok=False)
        raise UpstreamUnavailable(f"engine unreachable: {exc}") from None
    if upstream.status in (404, 405) and not await _is_openai_error(upstream):
        upstream.close()
        app.metrics.passthrough.labels(label, str(upstream.status)).inc()
        error = NotFoundError(f"no route {request.method} {request.path} on this proxy or its engine")
        error.status = upstream.status
        raise error
    try:
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers={
            k: v for k, v in upstream.headers.items() if k.lower() not in DROPPED})
        if upstream.headers.get("Content-Length") is not None:
            response.content_length = int(upstream.headers["Content-Length"])
        await response.prepare(request)
        async for data in upstream.content.iter_any():
            await response.write(data)
        await response.write_eof()
        return response
    except (aiohttp.ClientError, asyncio.TimeoutError):
        request.transport is not None and request.transport.close()  # cut mid-body: the agent sees a short read
        return response
    finally:
        upstream.close()
        app.metrics.passthrough.labels(label, str(upstream.status)).inc()


async def _is_openai_error(upstream: aiohttp.ClientResponse) -> bool:
    """Whether a 404/405 is the engine's answer about something it serves (a model it does not know: relayed),
    rather than about a path or method it has no route for (the proxy answers that in its own error shape)."""
    try:
        body = orjson.loads(await upstream.read())
    except (orjson.JSONDecodeError, aiohttp.ClientError, asyncio.TimeoutError):
        return False
    return isinstance(body, dict) and isinstance(body.get("error"), dict)


def add_routes(app: web.Application) -> None:
    """Registered last: every route the proxy owns is matched first."""
    for prefix in ("/rollouts/{rollout_id}/agents/{agent}", "/rollouts/{rollout_id}", ""):
        app.router.add_route("*", prefix + "/{tail:.*}", passthrough)
