"""Each named policy's line for the trainer worker: the version it trains from, and what moves it.

A line starts where its policy serves (its active version, or the base model), follows an operator's activation
(a rollback is followed, not undone by the next publish), moves to a new version once that version is published
and, where a gate decides (`on_published`), the gate passed; and goes back to what serves when it did not. The
worker holds the model: what this answers (`follow`, `publish`) tells it when the adapter in the model is no
longer the line's, so it loads the line's again; this module never touches the model.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from core.step_record import StepRecord
from store import policies
from trainer.agreement import Agreement
from trainer.metrics import TrainerMetrics
from trainer.publish import Publisher

log = logging.getLogger("rlproxy.trainer")


@dataclass(slots=True)
class Line:
    """What the trainer continues from for one named policy: the version serving it (or that it will)."""
    policy: str
    parent_version: int = policies.BASE_VERSION
    parent_path: Path | None = None

    def start_from(self, active: policies.ActivePolicy) -> None:
        """Train on from `active`, the version serving the policy now."""
        self.parent_version, self.parent_path = active.version, Path(active.path) if active.path else None


@dataclass(slots=True)
class Trained:
    """One policy's new version from one step, before it is recorded."""
    line: Line
    version: int
    path: Path
    transitions: int
    record: StepRecord
    agreement: Agreement | None = None  # of the version it was trained from, on the calls that version served


class Lines:
    """The lines of the policies one worker trains (`lines`: policy name -> Line, in the settings' order)."""

    def __init__(self, names: list[str], sessions: async_sessionmaker[AsyncSession], publisher: Publisher,
                 metrics: TrainerMetrics, on_published=None) -> None:
        self.lines = {name: Line(name) for name in names}
        self.first = names[0]  # the policy the single-policy gauges (active_version) follow
        self.sessions = sessions
        self.publisher = publisher
        self.metrics = metrics
        # async callback(version) -> bool | None: an eval gate; False keeps the parent, None decides nothing
        self.on_published = on_published

    async def resume(self, session: AsyncSession) -> None:
        """Every line from the version that serves its policy now."""
        for line in self.lines.values():
            line.start_from(await policies.active_policy(session, line.policy))

    def observe(self, line: Line) -> None:
        self.metrics.policy_version.labels(line.policy).set(line.parent_version)
        if line.policy == self.first:
            self.metrics.active_version.set(line.parent_version)

    def follow(self, line: Line, active: policies.ActivePolicy) -> bool:
        """Train from the version that serves: True when an operator activated another one (a rollback) while this
        trainer ran, so the line moved to it."""
        if active.version == line.parent_version:
            return False
        log.warning("policy %r serves v%d, not v%d that this trainer last published (an operator's activation): "
                    "training goes on from v%d", line.policy, active.version, line.parent_version, active.version)
        line.start_from(active)
        self.observe(line)
        return True

    async def publish(self, line: Line, version: int, path: Path, step_began: float) -> bool:
        """Publish `version` and, once it serves (and the gate passed), train `line` from it. False when the line
        went back to what serves instead (the engines declined it, the gate refused it): the model may hold the
        version that did not make it."""
        published = await self.publisher.publish(version, str(path), activate=self.on_published is None,
                                                 replacing=line.parent_version)
        if published.error is not None:
            (self.metrics.publish_declined if published.declined else self.metrics.publish_failures).inc()
            return await self._revert(line)
        if self.on_published is not None and not published.activated:
            decision = await self.on_published(version)
            if decision is None:  # the gate was interrupted: the version stays a candidate for the next run
                return True
            if decision:
                if (await self.publisher.activate(version, replacing=line.parent_version)).declined:
                    self.metrics.publish_declined.inc()
                    return await self._revert(line)
            else:
                await self.publisher.retire(version)
                return await self._revert(line)
        line.parent_version, line.parent_path = version, path
        self.observe(line)
        self.metrics.publish_duration.observe(time.perf_counter() - step_began)
        return True

    async def _revert(self, line: Line) -> bool:
        """Continue training `line` from the version that serves it, not from a version that did not make it."""
        async with self.sessions() as session:
            line.start_from(await policies.active_policy(session, line.policy))
        return False

    async def leftovers(self) -> list[tuple[Line, int, Path]]:
        """(line, version, adapter folder) of each version a trainer stopped between recording and publishing
        (or while its canary ran), oldest first per line, whose adapter is still on disk."""
        found = []
        for line in self.lines.values():
            async with self.sessions() as session:
                versions = await policies.unpublished_versions(session, line.policy, line.parent_version)
            found += [(line, policy.version, Path(policy.path)) for policy in versions
                      if policy.path and Path(policy.path).exists()]
        return found
