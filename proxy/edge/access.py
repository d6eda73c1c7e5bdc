"""What each route needs and whose key a request holds: the access table (public, any key, a project's admin key,
the operator key alone), the routes whose calls belong to a rollout, and the two request keys the edge sets (the
application's Authenticator, the request's KeyInfo).

Its own module because both sides read it: the authenticator (proxy/edge/auth.py) resolves keys and enforces the
table, the rollout token's scope (proxy/edge/token_scope.py) reads which route a request is on and whose key it is,
and the limits (proxy/edge/limits.py) which requests count against a key. It imports neither of them."""
from __future__ import annotations

from enum import Enum

from aiohttp import web

from proxy.edge.engine_routes import RELAYED
from store.keys import KeyInfo

OPERATOR = KeyInfo(id="operator", project=None, admin=True)  # the admin key from the settings
# The application's proxy/edge/auth.py Authenticator (proxy/checks.py sets it; named, not imported: auth.py imports
# this module), and the request's KeyInfo once it identified one.
AUTH: web.AppKey = web.AppKey("rlproxy_auth")
KEY = "rlproxy_key"  # set when auth is on, or when a request presents a rollout token with auth off


class Access(Enum):
    PUBLIC = "public"
    KEY = "key"
    ADMIN = "admin"
    OPERATOR = "operator"  # the whole proxy's, not a project's: no project's key, admin or not


# The web view's page and assets hold no data (what it shows comes from /ui/api/…, which needs a key).
PUBLIC_ROUTES = {"/healthz", "/readyz", "/openapi.json", "/ui/", "/ui/assets/{name}"}
ADMIN_ROUTES = {("POST", "/policies/{version}/activate")}
# Prometheus scrapes with the operator key (helm/rlproxy/templates/servicemonitor.yaml); Kubernetes probes need none.
OPERATOR_ROUTES = {("GET", "/metrics")}
# Routes whose calls belong to the rollout in their path (so a key may only use its own project's rollouts):
# the recorded routes and the engine routes relayed beside them.
# The Gemini API's methods (proxy/routes/gemini.py), under /v1beta and /v1, and its model list.
GEMINI_METHODS = tuple(f"{version}/models/{{model}}:{method}" for version in ("/v1beta", "/v1")
                       for method in ("generateContent", "streamGenerateContent", "countTokens"))
OPENAI_SUFFIXES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/responses",
                   "/v1/responses/{response_id}", "/v1/messages", "/v1/messages/count_tokens", *GEMINI_METHODS,
                   "/v1beta/models", *RELAYED)
# Where a request's key may be: besides `Authorization: Bearer`, Anthropic's clients' header and Google's.
KEY_HEADERS = ("x-api-key", "x-goog-api-key")


def route_pattern(request: web.Request) -> str | None:
    """The matched route's pattern (e.g. `/rollouts/{rollout_id}`), None for unknown paths."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else None


def access_for(request: web.Request) -> Access:
    pattern = route_pattern(request)
    method = "GET" if request.method == "HEAD" else request.method
    if pattern in PUBLIC_ROUTES and method == "GET":
        return Access.PUBLIC
    if (method, pattern) in ADMIN_ROUTES:
        return Access.ADMIN
    if (method, pattern) in OPERATOR_ROUTES:
        return Access.OPERATOR
    return Access.KEY  # unknown paths too: what exists is not shown to callers without a key


# Rollout-scoped routes that neither record a call nor read the rollout: under another project's id they answer as
# under an unused one (which they do not claim either).
UNRECORDED_SUFFIXES = ("/v1/models", "/v1/messages/count_tokens", "/v1beta/models", *RELAYED,
                       *(method for method in GEMINI_METHODS if method.endswith(":countTokens")))


def reads_no_rollout(request: web.Request) -> bool:
    pattern = route_pattern(request)
    return pattern is not None and pattern.endswith(UNRECORDED_SUFFIXES)


def is_openai_route(request: web.Request) -> bool:
    pattern = route_pattern(request)
    return pattern is not None and pattern.endswith(OPENAI_SUFFIXES)


def is_operator_key(key: KeyInfo) -> bool:
    """The operator key is the one admin key of no project (every database key belongs to one)."""
    return key.admin and key.project is None
