"""The engine routes of the allow-list (proxy/edge/engine_routes.py: tokenize, embeddings, pooling, score, rerank,
classify, health, …) are relayed to the rollout's engine replica, also under the `/rollouts/{id}[/agents/{agent}]`
prefixes. Such calls are counted in metrics (`rlproxy_passthrough_requests_total`), never recorded or trained on;
they carry the key's tenant scope (another project's rollout in the prefix is 404, by the auth middleware) and the
request limits. Their body crosses the request boundary like every other (proxy/boundary.py): read once by its
rules (a body they refuse is 400 and never relayed), checked (only the route's fields, proxy/edge/engine_routes.py
`FIELDS`; a `model` the key may call, proxy/tenancy.py), and sent as the bytes serialised from what was checked, under the proxy's own headers (a
client's headers are not passed on: vLLM reads a request id from `X-Request-Id`). The engine's answer comes back
byte for byte, streamed. Any other path is not routed at all: 404 (405 for a listed path with another method), in
the proxy's own error shape.

The engine path is the table's, not the request's: whatever spelling matched, the engine gets the listed path,
sent as it is (`encoded=True`: yarl would otherwise resolve dot segments), and never a query string. vLLM 0.32's
relayed routes read no query parameter, so a query would be the one input that skips the request boundary (a
later engine reading `?model=` would take another project's adapter past the model check): a request carrying
one is refused, 400 naming its first parameter, rather than relayed, or dropped while the client believes it
did something.
The agent's own `Authorization` header is never passed on; the engines get the proxy's key.

ENDPOINTS describes the listed routes (bare) for the OpenAPI document; the same list, mounted under each prefix,
is what the app registers."""
from __future__ import annotations

import asyncio

import aiohttp
import orjson
from aiohttp import web
from yarl import URL

from proxy.bodies import EngineObject
from proxy.boundary import engine_bytes
from proxy.context import call_context
from proxy.api import Answer, Endpoint, PREFIXES, mounted, register
from proxy.edge import FIELDS, RELAYED
from proxy.errors import InvalidRequest, NotFoundError, UpstreamTimeout, engine_failure
from proxy.schemas import EngineRequest
from proxy.state import state

# Of the engine's answer, hop-by-hop headers (RFC 9110 §7.6.1) and what the proxy sets itself are not copied.
DROPPED = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
           "transfer-encoding", "upgrade", "host", "content-length", "authorization", "x-api-key",
           "content-encoding"}  # the engine's answer arrives decoded by the client session
JSON_BODY = {"Content-Type": "application/json"}  # a relayed body's only header: the proxy's, not the client's


def engine_path(request: web.Request) -> str:
    """The listed path a request matched: its route's pattern without the rollout prefix (every prefix ends in
    a `{…}` name, and no listed path has one)."""
    return request.match_info.route.resource.canonical.rsplit("}", 1)[-1]


def upstream_url(replica_url: str, path: str) -> URL:
    base = URL(replica_url)
    return URL.build(scheme=base.scheme, user=base.raw_user, password=base.raw_password, host=base.raw_host,
                     port=base.explicit_port, path=base.raw_path.rstrip("/") + path, encoded=True)


def refuse_query(request: web.Request, path: str) -> None:
    """400 for a query string: no relayed route documents a query parameter (see the module's docstring). A bare
    `?` carries none and passes."""
    raw = request.rel_url.raw_query_string
    if not raw:
        return
    name = next(iter(request.query), None) or raw  # `?&`, `?=x`: no name to give, so the query as sent
    raise InvalidRequest(f"Unknown query parameter: '{name[:64]}'. {path} takes no query parameters; send the "
                         "request's fields in its JSON body", param=name[:64], code="unknown_parameter")


async def passthrough(request: web.Request) -> web.StreamResponse:
    path = engine_path(request)
    refuse_query(request, path)
    context = call_context(request)  # validates the ids in a prefixed path
    app = state(request)
    data, headers = None, None
    if request.method == "POST" and path not in NO_BODY:
        body = app.boundary.relayed(await request.read(), FIELDS[path])
        app.boundary.check_media(body)
        if isinstance(body.get("model"), str):
            await app.access.check(body["model"], context.project)
        data, headers = engine_bytes(body), JSON_BODY
    replica = app.upstreams.choose(context.rollout_id)
    try:
        upstream = await app.upstreams.session.request(
            request.method, upstream_url(replica.url, path), data=data, headers=headers, allow_redirects=False)
    except asyncio.TimeoutError:
        raise UpstreamTimeout("engine did not answer in time") from None
    except (aiohttp.ClientError, OSError) as exc:
        app.upstreams.mark(replica, ok=False)
        raise engine_failure("engine unreachable", exc) from None
    if upstream.status in (404, 405) and not await _is_openai_error(upstream):
        upstream.close()
        app.metrics.passthrough.labels(path, str(upstream.status)).inc()
        error = NotFoundError(f"no route {request.method} {request.path} on this proxy's engine")
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
        app.metrics.passthrough.labels(path, str(upstream.status)).inc()


async def _is_openai_error(upstream: aiohttp.ClientResponse) -> bool:
    """Whether a 404/405 is the engine's answer about something it serves (a model it does not know: relayed),
    rather than about a route it does not have (a pooling route of a generative model: the proxy answers that
    in its own error shape)."""
    try:
        body = orjson.loads(await upstream.read())
    except (orjson.JSONDecodeError, aiohttp.ClientError, asyncio.TimeoutError):
        return False
    return isinstance(body, dict) and isinstance(body.get("error"), dict)


NO_BODY = {"/health", "/ping"}  # liveness: an empty 200, whatever the method
RELAYED_ANSWER = Answer("The engine's answer, relayed as the engine sent it (not recorded).", EngineObject)
LIVE_ANSWER = Answer("The engine is up (an empty body, as vLLM answers).")


def _endpoint(path: str, method: str) -> Endpoint:
    live = path in NO_BODY
    return Endpoint(method.lower(), path, passthrough, f"The engine's {path}, relayed (not recorded)",
                    {200: LIVE_ANSWER if live else RELAYED_ANSWER}, (400, 404, 502, 503, 504),
                    body=None if live or method == "GET" else EngineRequest, engine_errors=True,
                    context_headers=True)


ENDPOINTS = [_endpoint(path, method) for path, methods in RELAYED.items() for method in methods]


def add_routes(app: web.Application) -> None:
    """Each listed path and method under each prefix, exactly as written; registered after the proxy's own."""
    register(app, mounted(ENDPOINTS, PREFIXES))
