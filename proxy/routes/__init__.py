"""The proxy's own routes, one module per API, each listing its Endpoints (proxy/api/endpoints.py); `all_endpoints()`
is every one of them in the order they are matched. The passthrough (proxy/routes/passthrough.py) comes after;
`documented_endpoints()` is what `GET /openapi.json` describes: both."""
from __future__ import annotations

from proxy.api import Endpoint
from proxy.routes import (docs, events, gemini, messages, openai, ops, passthrough, policies, responses, rollouts,
                          traces, ui)


def all_endpoints() -> list[Endpoint]:
    return [*openai.ENDPOINTS, *responses.ENDPOINTS, *messages.ENDPOINTS, *gemini.ENDPOINTS, *rollouts.ENDPOINTS,
            *events.ENDPOINTS,
            *traces.ENDPOINTS, *policies.ENDPOINTS, *ops.ENDPOINTS, *docs.ENDPOINTS,
            *ui.ENDPOINTS]


def documented_endpoints() -> list[Endpoint]:
    """The proxy's own routes and the relayed engine routes (described without a rollout prefix)."""
    return all_endpoints() + passthrough.ENDPOINTS
