"""Policies: `GET /policies`, and `POST /policies/{version}/activate` to switch or roll back what is served."""
from __future__ import annotations

from aiohttp import web

from proxy.bodies import Activated, PolicyList
from proxy.endpoints import Answer, Endpoint
from proxy.errors import InvalidRequest, NotFoundError, UpstreamUnavailable
from proxy.state import state
from rlproxy import lifecycle
from rlproxy.adapters import AdapterError
from store import policies as store_policies


async def list_policies(request: web.Request) -> web.Response:
    async with state(request).sessions() as session:
        listed = await store_policies.list_policies(session, project=request.get("project"))
    return PolicyList(data=listed, active=state(request).router.active.version).reply()


async def activate_policy(request: web.Request) -> web.Response:
    try:
        version = int(request.match_info["version"].removeprefix("v"))
    except ValueError:
        raise InvalidRequest("policy version must be an integer like 3 or v3", param="version") from None
    if not 0 <= version < 2**31:  # versions are 32-bit in the store: anything else cannot exist
        raise NotFoundError(f"policy version {version} does not exist")
    app = state(request)
    try:
        # A rollback target is loaded again from its own folder on every replica before it serves, so weights
        # left under its name (another store's, or an older copy) never answer for it.
        await lifecycle.activate(app.sessions, app.upstreams.adapters(), version)
    except AdapterError as exc:
        raise UpstreamUnavailable(f"policy version {version} was not activated: {exc}") from None
    await app.router.refresh()
    app.metrics.active_policy.set(version)
    return Activated(version=version, status="active").reply()


ENDPOINTS = [
    Endpoint("get", "/policies", list_policies, "Policy versions and which one serves",
             {200: Answer("Versions.", PolicyList)}),
    Endpoint("post", "/policies/{version}/activate", activate_policy, "Serve this version (rollback too); admin only",
             {200: Answer("Now serving.", Activated)}, (400, 404, 502), access="admin",
             path_params={"version": {"type": "string", "pattern": r"^v?[0-9]{1,9}$"}}),
]
