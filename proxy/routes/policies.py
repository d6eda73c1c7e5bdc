"""Policies: `GET /policies`, and `POST /policies/{version}/activate` to switch or roll back what is served.

Both take `?policy=NAME` for a named policy other than the default one (core/policy_rules.py).

Scoped like data (docs/security.md, "Who may do what"): a project's key reads the policies its project's calls
can be routed to, and a project admin key activates only the policies no other project's calls reach
(`PolicyRules.owned_by`). Any other policy answers as one that does not exist: an empty line on `GET`, 404 on
activation, worded alike for a name or version that exists and one that does not, so nothing leaks. The
operator key (no project), and a proxy without keys, read and activate every policy."""
from __future__ import annotations

from aiohttp import web

from core.policy_rules import RuleError, check_policy_name
from proxy.bodies import Activated, PolicyList
from proxy.api import Answer, Endpoint
from proxy.errors import InvalidRequest
from proxy.state import state
from store import policies as store_policies
from store import step_history

YIELD_WINDOW = 10  # steps: the trainer's default yield_window, over which its yield ALERTs look
UNTRAINED = "/"  # a name no version can have (check_policy_name refuses it): reads as a line never trained

POLICY_QUERY = {"policy": {"type": "string", "pattern": r"^[A-Za-z0-9._-]{1,64}$",
                           "description": "A named policy (default: the proxy's default policy)."}}


def _policy(request: web.Request) -> str:
    name = request.query.get("policy") or state(request).router.rules.default
    try:
        return check_policy_name(name)
    except RuleError as exc:
        raise InvalidRequest(str(exc), param="policy") from None


def _readable(request: web.Request) -> set[str] | None:
    """The policies this key may read; None: every one (the operator key, or no keys)."""
    project = request.get("project")
    return None if project is None else state(request).router.rules.reachable(project)


def _activatable(request: web.Request) -> set[str] | None:
    """The policies this key may activate; None: every one (the operator key, or no keys)."""
    project = request.get("project")
    return None if project is None else state(request).router.rules.owned_by(project)


async def list_policies(request: web.Request) -> web.Response:
    app, policy, readable = state(request), _policy(request), _readable(request)
    shown = readable is None or policy in readable
    async with app.sessions() as session:
        # another project's policy reads as one with no versions: the base row of a name never trained
        listed = await store_policies.list_policies(session, project=request.get("project"),
                                                    policy=policy if shown else UNTRAINED)
        known = await store_policies.names(session)
        served = {name: app.router.line(name).active.version
                  for name in dict.fromkeys([*app.router.rules.policies(), *known])
                  if readable is None or name in readable}
        yields = None if request.get("project") is not None else {
            name: await step_history.recent_yield(session, name, window=YIELD_WINDOW) for name in served}
    listed[0] = {**listed[0], "policy": policy}
    active = app.router.line(policy).active.version if shown else store_policies.BASE_VERSION
    return PolicyList(data=listed, policy=policy, active=active, policies=served, yields=yields).reply()


async def activate_policy(request: web.Request) -> web.Response:
    try:
        version = int(request.match_info["version"].removeprefix("v"))
    except ValueError:
        raise InvalidRequest("policy version must be an integer like 3 or v3", param="version") from None
    app = state(request)
    policy = await app.router.activate(version, _policy(request), named="policy" in request.query,
                                       activatable=_activatable(request), metrics=app.metrics)
    return Activated(version=version, policy=policy, status="active").reply()


ENDPOINTS = [
    Endpoint("get", "/policies", list_policies, "A named policy's versions and which one serves",
             {200: Answer("Versions.", PolicyList)}, (400,), query_params=POLICY_QUERY),
    Endpoint("post", "/policies/{version}/activate", activate_policy,
             "Serve this version (rollback too; 0 with ?policy= returns that policy to the base model); admin only",
             {200: Answer("Now serving.", Activated)}, (400, 404, 409, 502), access="admin",
             path_params={"version": {"type": "string", "pattern": r"^v?[0-9]{1,9}$"}}, query_params=POLICY_QUERY),
]
