"""Which policy answers: the served model name routes to the active adapter (or the base model), read from
the store every `policy_refresh_interval` so every proxy sharing the database follows activations."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from store.policies import BASE, ActivePolicy, active_policy

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
        self._task: asyncio.Task | None = None

    def route(self, requested_model: str) -> Route:
        if requested_model != self.served_model:
            return Route(requested_model, None)
        if self.active.name is not None:
            return Route(self.active.name, self.active.version)
        return Route(self.base_model or requested_model, self.active.version)

    async def refresh(self) -> None:
        async with self.sessions() as session:
            current = await active_policy(session)
        if current != self.active:
            log.info("now serving policy version %d (%s)", current.version, current.name or "base model")
        self.active = current

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
