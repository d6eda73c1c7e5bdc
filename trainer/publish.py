"""Publishing a trained adapter with no downtime, for the trainer worker: commit it to the engine fleet under
its own name (loaded on every replica and verified, engine/fleet.py), and only then make it the active policy
(the proxies follow within a second, routing it only to the replicas that verified it). Fewer than a majority
of replicas verifying it leaves the old version serving and marks the new one failed. Versions that stop
serving are unloaded once drained. The rules are engine/lifecycle.py's; this keeps the worker's drain between
steps."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from core.settings.train import DRAIN_SECONDS
from engine import lifecycle
from engine.adapters import AdapterError, EngineAdapters, LoadFailed
from engine.fleet import FleetMetrics
from store.errors import ActiveChanged

log = logging.getLogger("rlproxy.publish")

__all__ = ["LoadFailed", "Published", "Publisher"]


@dataclass(slots=True, frozen=True)
class Published:
    version: int
    activated: bool
    load_seconds: float
    error: str | None = None
    withheld: dict[str, str] = field(default_factory=dict)  # replica -> why it is out of rotation for it
    declined: bool = False  # not made active: the policy's active version changed while it trained


class Publisher:
    def __init__(self, sessions: async_sessionmaker[AsyncSession],
                 engines: list[str] | tuple[str, ...], *, drain_seconds: float = DRAIN_SECONDS, attempts: int = 5,
                 api_key: str | None = None, metrics: FleetMetrics | None = None, probe: bool = True) -> None:
        self.sessions = sessions
        self.adapters = EngineAdapters(engines, api_key=api_key, attempts=attempts)  # api_key: vLLM --api-key
        self.drain = lifecycle.Drain(drain_seconds)
        self.metrics = metrics
        self.probe = probe  # False: the digest only (lifecycle.publish)

    async def publish(self, version: int, path: str, *, activate: bool = True,
                      replacing: int | None = None) -> Published:
        """Publish recorded candidate `version`; `path` is its folder as recorded on its row, which is what is
        loaded. `replacing`: the version it was trained from, which it replaces only if that still serves."""
        try:
            committed = await lifecycle.publish(self.sessions, self.adapters, version, activate=activate,
                                                drain=self.drain, probe=self.probe, metrics=self.metrics,
                                                replacing=replacing)
        except AdapterError as exc:
            log.error("policy v%d not published: %s; the current policy keeps serving", version, exc)
            return Published(version, False, 0.0, str(exc))
        except ActiveChanged as exc:
            return await self._declined(version, exc)
        withheld = {replica: str(error) for replica, error in committed.withheld.items()}
        if not activate:
            return Published(version, False, committed.seconds, withheld=withheld)
        log.info("policy v%d active (verified on %d of %d engine(s) in %.2fs)", version, len(committed.verified),
                 len(self.adapters.engines), committed.seconds)
        await self.unload_drained()
        return Published(version, True, committed.seconds, withheld=withheld)

    async def activate(self, version: int, replacing: int | None = None) -> Published:
        """Make a published version the one served (a gate promoted it); the one it replaces is unloaded once
        drained. `replacing`: only if that version still serves (else declined, as `publish`)."""
        try:
            await lifecycle.activate(self.sessions, self.adapters, version, drain=self.drain, metrics=self.metrics,
                                     replacing=replacing)
        except ActiveChanged as exc:
            return await self._declined(version, exc)
        return Published(version, True, 0.0)

    async def _declined(self, version: int, exc: ActiveChanged) -> Published:
        """An operator activated another version while this one trained: theirs serves; this one is retired."""
        log.error("ALERT: %s; it is retired and training goes on from the version that serves", exc)
        await lifecycle.retire(self.sessions, version, drain=self.drain)
        return Published(version, False, 0.0, str(exc), declined=True)

    async def retire(self, version: int) -> bool:
        """A loaded version that will not serve (a gate kept it out): retired, and unloaded once drained; False
        when an operator made it active meanwhile (it stays)."""
        return await lifecycle.retire(self.sessions, version, drain=self.drain)

    async def unload_drained(self) -> None:
        """Unload versions that stopped serving more than `drain_seconds` ago (`TrainerSettings.drain_seconds`)."""
        await self.drain.sweep(self.sessions, self.adapters)
