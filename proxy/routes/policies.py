"""Policies: `GET /policies`, and `POST /policies/{version}/activate` to switch or roll back what is served."""
from __future__ import annotations

from aiohttp import web

from proxy.errors import InvalidRequest, NotFoundError, UpstreamUnavailable, json_response
from proxy.state import state
from store import policies as store_policies


async def list_policies(request: web.Request) -> web.Response:
    async with state(request).sessions() as session:
        listed = await store_policies.list_policies(session, project=request.get("project"))
        return json_response({"data": listed,
                              "active": state(request).router.active.version})


async def activate_policy(request: web.Request) -> web.Response:
    try:
        version = int(request.match_info["version"].removeprefix("v"))
    except ValueError:
        raise InvalidRequest("policy version must be an integer like 3 or v3", param="version") from None
    if not 0 <= version < 2**31:  # versions are 32-bit in the store: anything else cannot exist
        raise NotFoundError(f"policy version {version} does not exist")
    app = state(request)
    async with app.sessions() as session, session.begin():
        if version != store_policies.BASE_VERSION:
            policy = await store_policies.get_policy(session, version)
            await _load_everywhere(request, policy.name, policy.path)
        await store_policies.activate(session, version)
    await app.router.refresh()
    app.metrics.active_policy.set(version)
    return json_response({"version": version, "status": "active"})


async def _load_everywhere(request: web.Request, name: str, path: str | None) -> None:
    """An adapter must be resident on every replica before it may serve (e.g. after a rollback to one that
    was unloaded)."""
    upstreams = state(request).upstreams
    for replica in upstreams.replicas:
        status, body = await upstreams.post_json(replica, "/v1/load_lora_adapter",
                                                 {"lora_name": name, "lora_path": path})
        if status != 200 and b"already" not in body.lower():
            raise UpstreamUnavailable(f"engine {replica.url} could not load {name}: {body[:300]!r}")


def add_routes(app: web.Application) -> None:
    app.router.add_get("/policies", list_policies)
    app.router.add_post("/policies/{version}/activate", activate_policy)
