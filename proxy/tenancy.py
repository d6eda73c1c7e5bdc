"""Which models a project's key may call: the base model(s) the engines serve, the served model name (or
"auto"), and the adapters of the policies its calls can be routed to (core/policy_rules.py `reachable`):
never another project's adapter. A model outside that set answers 404 `model_not_found` before anything reaches the engine or
the recorder, worded alike for a name that does not exist and one that is someone else's, so names do not leak;
`GET /v1/models` lists only the set. Keys of no project (the operator's) and a proxy without keys may call
anything the engines serve.

An adapter's policy is read from the store once and kept: a version's name and policy never change."""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from proxy.errors import NotFoundError, StoreUnavailable
from proxy.policy import AUTO_MODEL, PolicyRouter
from proxy.upstream import UpstreamPool
from store import policies

log = logging.getLogger("rlproxy.tenancy")


class ModelNotFound(NotFoundError):
    """OpenAI's answer for a model that does not exist or that the key may not use."""

    def __init__(self, model: str) -> None:
        super().__init__(f"The model `{model}` does not exist or you do not have access to it.", param="model",
                         code="model_not_found")


class ModelAccess:
    def __init__(self, router: PolicyRouter, upstreams: UpstreamPool) -> None:
        self.router = router
        self.upstreams = upstreams
        self._policies: dict[str, str] = {}  # adapter name -> its named policy (only names that are versions)

    def _base_models(self) -> set[str]:
        names = {m for replica in self.upstreams.replicas for m in replica.base_models}
        # "auto" (Agent Lightning's name for "the rollout's policy") routes like the served model name
        return names | {n for n in (self.router.served_model, self.router.base_model, AUTO_MODEL) if n}

    async def _policies_of(self, models: list[str]) -> dict[str, str]:
        unknown = [m for m in dict.fromkeys(models) if m not in self._policies]
        if unknown:
            try:
                async with asyncio.timeout(10), self.router.sessions() as session:
                    self._policies.update(await policies.adapter_policies(session, unknown))
            except (SQLAlchemyError, OSError, TimeoutError) as exc:
                log.warning("adapter lookup failed: %s", exc)
                raise StoreUnavailable("could not check the model: the database did not answer") from None
        return {m: self._policies[m] for m in models if m in self._policies}

    async def allowed(self, models: list[str], project: str | None) -> set[str]:
        """Those of `models` a key of `project` may call."""
        if project is None:
            return set(models)
        base = self._base_models()
        others = [m for m in models if m not in base]
        reachable = self.router.rules.reachable(project)
        owned = await self._policies_of(others) if others else {}
        return {m for m in models if m in base or owned.get(m) in reachable}

    async def check(self, model: str, project: str | None) -> None:
        if project is not None and model not in await self.allowed([model], project):
            raise ModelNotFound(model)

    async def visible(self, listing: dict[str, Any], project: str | None) -> dict[str, Any]:
        """The engine's model list with only the models a key of `project` may call."""
        data = listing.get("data")
        if project is None or not isinstance(data, list):
            return listing
        ids = [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
        allowed = await self.allowed(ids, project)
        return {**listing, "data": [m for m in data if isinstance(m, dict) and m.get("id") in allowed]}
