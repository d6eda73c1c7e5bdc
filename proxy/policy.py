"""Which policy answers: the served model name routes to the active adapter (or the base model) — or, while a
canary runs, to the canary for the fixed fraction of rollouts its hash picks (store/canary.py). Both are read
from the store every `policy_refresh_interval`, so every proxy sharing the database follows activations and
agrees on which rollouts the canary answers."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from store import canary as canaries
from store.policies import BASE, ActivePolicy

log = logging.getLogger("rlproxy.policy")


@dataclass(slots=True, frozen=True)
class Route:
    upstream_model: str
    policy_version: int | None  # None: a model outside the policy (e.g. an explicit adapter or other model)


class PolicyRouter:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], served_model: str | None) -> None:
        self.sessions = sessions
        self.served_model = served_model
        self.base_model: str | None = None
        self.active: ActivePolicy = BASE
        self.canary: canaries.Canary | None = None
        self._task: asyncio.Task | None = None

    def policy_for(self, rollout_id: str | None) -> ActivePolicy:
        """The policy that answers the served model for this rollout; a call without a rollout gets the
        active one (the canary is judged by rollouts, so it only takes calls it can be judged by)."""
        canary = self.canary
        if canary is not None and rollout_id is not None and canaries.serves(canary, rollout_id):
            return ActivePolicy(canary.version, canary.name)
        return self.active

    def version_for(self, rollout_id: str | None) -> int:
        return self.policy_for(rollout_id).version

    def route(self, requested_model: str, rollout_id: str | None = None) -> Route:
        if requested_model != self.served_model:
            return Route(requested_model, None)
        policy = self.policy_for(rollout_id)
        if policy.name is not None:
            return Route(policy.name, policy.version)
        return Route(self.base_model or requested_model, policy.version)

    async def refresh(self) -> None:
        async with self.sessions() as session:
            active, canary = await canaries.serving(session)
        if active != self.active:
            log.info("now serving policy version %d (%s)", active.version, active.name or "base model")
        if canary != self.canary:
            if canary is not None:
                log.info("canary: policy version %d answers %.0f%% of new rollouts", canary.version,
                         100 * canary.fraction)
            else:
                log.info("canary of policy version %d ended", self.canary.version)
        self.active, self.canary = active, canary

    async def start(self, interval: float) -> None:
        await self.refresh()
        self._task = asyncio.create_task(self._loop(interval), name="policy-refresh")

    async def _loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.refresh()
            except Exception as exc:  # noqa: BLE001 — keep serving the last known policy
                log.warning("could not read the active policy: %s", exc)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
