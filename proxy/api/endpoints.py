"""What a route is, in one place: its method and path, its handler, and what it takes and answers. Each module in
proxy/routes/ lists its routes as Endpoints; the app registers them (proxy/app.py) and the OpenAPI document is
generated from the same list and the body models (proxy/api/openapi.py), so a route cannot be served undocumented
or documented unserved (tests/api/test_openapi.py checks both ways)."""
from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel

from proxy.edge import UNREADABLE_BODY, expect_later

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Shared by the route modules (which never import each other): where the OpenAI-compatible routes are mounted (at
# /v1/… and under a rollout's base_url), the errors a recorded API route answers itself, and what a route under a
# rollout adds to its summary.
PREFIXES = ("", "/rollouts/{rollout_id}", "/rollouts/{rollout_id}/agents/{agent}")
API_ERRORS = (400, 404, 502, 503, 504)
RECORDED = " (recorded into the rollout in the path)"


@dataclass(frozen=True)
class Answer:
    """One documented success (or, for /readyz, not-ready) answer."""

    description: str
    model: type[BaseModel] | None = None  # its JSON body
    stream: bool = False  # may also be server-sent events (`stream: true`)
    text: bool = False  # text/plain (Prometheus' format) instead of JSON
    call_id: bool = False  # carries X-Rlproxy-Call-Id
    media: tuple[str, ...] = ()  # other media types it may be (the web view's page and assets), as text


@dataclass(frozen=True)
class Endpoint:
    method: Literal["get", "post"]
    path: str
    handler: Handler
    summary: str
    answers: dict[int, Answer]
    errors: tuple[int, ...] = ()  # statuses the proxy answers with its error shape (proxy/api/openapi.py says what)
    body: type[BaseModel] | None = None  # the request body's model
    body_required: bool = True
    example: Callable[[str], dict[str, Any]] | None = None  # an API request's example, given the served model;
    # with it the body is documented with the server's limits (max_tokens, n) written in
    access: Literal["key", "admin", "public"] = "key"
    engine_errors: bool = False  # the engine's own 4XX errors pass through
    anthropic: bool = False  # errors in Anthropic's shape
    google: bool = False  # errors in Google's shape (the Gemini API)
    context_headers: bool = False  # X-Rollout-Id and the other call-context headers apply
    path_params: dict[str, dict[str, Any]] = field(default_factory=dict)  # schemas of path names (else generic)
    # what a path name matches where it is not aiohttp's one segment (a Gemini model may hold a slash: Qwen/Qwen3-8B)
    patterns: dict[str, str] = field(default_factory=dict)
    query_params: dict[str, dict[str, Any]] = field(default_factory=dict)  # optional query parameters' schemas
    protobuf: bool = False  # the body may also be binary protobuf, answered in kind (OTLP's two encodings)


def mounted(endpoints: Iterable[Endpoint], prefixes: Iterable[str], recorded: str = "") -> list[Endpoint]:
    """Each endpoint under each prefix (the OpenAI-compatible routes live at /v1/… and under a rollout's
    base_url too); `recorded` is added to the summary of those under a rollout."""
    out = []
    for prefix in prefixes:
        for endpoint in endpoints:
            summary = endpoint.summary + (recorded if prefix and recorded and endpoint.body else "")
            out.append(dataclasses.replace(endpoint, path=prefix + endpoint.path, summary=summary))
    return out


def register(app: web.Application, endpoints: Iterable[Endpoint]) -> None:
    unreadable = app.setdefault(UNREADABLE_BODY, {})
    for endpoint in endpoints:
        path = endpoint.path
        for name, pattern in endpoint.patterns.items():
            path = path.replace(f"{{{name}}}", f"{{{name}:{pattern}}}")
        route = app.router.add_route(endpoint.method.upper(), path, endpoint.handler,
                                     expect_handler=expect_later)  # 100 Continue once the key and size pass
        # A body that cannot be read is 400, or 422 where the route answers malformed bodies so (/rollouts,
        # /reward, events: they list 422 and not 400, as proxy/api/openapi.py documents): also a compressed one.
        unreadable[route] = 400 if 400 in endpoint.errors else 422
