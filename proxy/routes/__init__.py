"""The proxy's own routes, one module per API, each listing its Endpoints (proxy/endpoints.py); `all_endpoints()`
is every one of them in the order they are matched. The passthrough (proxy/routes/passthrough.py) comes after."""
from __future__ import annotations

from proxy.endpoints import Endpoint


def all_endpoints() -> list[Endpoint]:
    from proxy.routes import docs, events, messages, openai, ops, policies, responses, rollouts, traces

    return [*openai.ENDPOINTS, *responses.ENDPOINTS, *messages.ENDPOINTS, *rollouts.ENDPOINTS, *events.ENDPOINTS,
            *traces.ENDPOINTS, *policies.ENDPOINTS, *ops.ENDPOINTS, *docs.ENDPOINTS]
