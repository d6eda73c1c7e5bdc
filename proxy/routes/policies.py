"""Policies: `GET /policies`, and `POST /policies/{version}/activate` to switch or roll back what is served.

Both take `?policy=NAME` for a named policy other than the default one (core/policy_rules.py)."""
from __future__ import annotations

from aiohttp import web

from core.policy_rules import BASE_POLICY, RuleError, check_policy_name
from engine import lifecycle
from engine.adapters import AdapterError
from proxy.bodies import Activated, PolicyList
from proxy.endpoints import Answer, Endpoint
from proxy.errors import InvalidRequest, NotFoundError, UpstreamUnavailable
from proxy.state import state
from store import policies as store_policies

POLICY_QUERY = {"policy": {"type": "string", "pattern": r"^[A-Za-z0-9._-]{1,64}$",
                           "description": "A named policy (default: the proxy's default policy)."}}


def _policy(request: web.Request) -> str:
    name = request.query.get("policy") or state(request).router.rules.default
    try:
        return check_policy_name(name)
    except RuleError as exc:
        raise InvalidRequest(str(exc), param="policy") from None


async def list_policies(request: web.Request) -> web.Response:
    app, policy = state(request), _policy(request)
    async with app.sessions() as session:
        listed = await store_policies.list_policies(session, project=request.get("project"), policy=policy)
        known = await store_policies.names(session)
    served = {name: app.router.line(name).active.version
              for name in dict.fromkeys([*app.router.rules.policies(), *known])}
    return PolicyList(data=listed, policy=policy, active=app.router.line(policy).active.version,
                      policies=served).reply()


async def activate_policy(request: web.Request) -> web.Response:
    try:
        version = int(request.match_info["version"].removeprefix("v"))
    except ValueError:
        raise InvalidRequest("policy version must be an integer like 3 or v3", param="version") from None
    if not 0 <= version < 2**31:  # versions are 32-bit in the store: anything else cannot exist
        raise NotFoundError(f"policy version {version} does not exist")
    app, policy = state(request), _policy(request)
    if version == store_policies.BASE_VERSION and policy == BASE_POLICY:
        raise InvalidRequest(f"{BASE_POLICY!r} is always the base model", param="policy")
    if version != store_policies.BASE_VERSION:
        async with app.sessions() as session:
            owner = await store_policies.policy_of(session, version)
        if "policy" in request.query and owner != policy:
            raise InvalidRequest(f"policy version {version} belongs to policy {owner!r}, not {policy!r}",
                                 param="policy")
        policy = owner
    try:
        # A rollback target is loaded again from its own folder on every replica before it serves, so weights
        # left under its name (another store's, or an older copy) never answer for it.
        await lifecycle.activate(app.sessions, app.upstreams.adapters(), version, policy=policy,
                                 metrics=app.metrics.fleet)
    except AdapterError as exc:
        raise UpstreamUnavailable(f"policy version {version} was not activated: {exc}") from None
    await app.router.refresh()
    app.metrics.observe_policies(app.router)
    return Activated(version=version, policy=policy, status="active").reply()


ENDPOINTS = [
    Endpoint("get", "/policies", list_policies, "A named policy's versions and which one serves",
             {200: Answer("Versions.", PolicyList)}, (400,), query_params=POLICY_QUERY),
    Endpoint("post", "/policies/{version}/activate", activate_policy,
             "Serve this version (rollback too; 0 with ?policy= returns that policy to the base model); admin only",
             {200: Answer("Now serving.", Activated)}, (400, 404, 502), access="admin",
             path_params={"version": {"type": "string", "pattern": r"^v?[0-9]{1,9}$"}}, query_params=POLICY_QUERY),
]
