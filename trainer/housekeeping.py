"""What the trainer does to the store besides training, between steps: with `reward` judge or judge+posted,
idle rollouts without a posted reward are scored by the judge (trainer/judge.py, before expiry gets to them);
rollouts whose final reward never came are marked expired (`reward_ttl_s`), and recorded data past
`pruning.older_than` (the settings `rlproxy prune` reads) is pruned the way it prunes (store/retention.py). Each
runs at most every tenth of its period (capped), in small transactions, so it never holds up a step or the
proxy's writes."""
from __future__ import annotations

import logging
import time
from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from core.settings import TrainerSettings
from store.dialect import database_now
from store.retention import prune
from store.rollouts import expire_open_rollouts
from trainer.judge import JudgeJob
from trainer.metrics import TrainerMetrics

log = logging.getLogger("rlproxy.trainer")

EXPIRY_BATCH = 1000


class Housekeeping:
    def __init__(self, settings: TrainerSettings, sessions: async_sessionmaker[AsyncSession],
                 metrics: TrainerMetrics) -> None:
        self.settings = settings
        self.sessions = sessions
        self.metrics = metrics
        self._next = {"judge": 0.0, "expiry": 0.0, "prune": 0.0}  # monotonic times of the next run
        training = settings.training  # the judge forms task groups as training does
        self.judge = (JudgeJob(settings, sessions, metrics, group_size=training.group_size,
                               group_timeout_s=training.group_timeout_s) if settings.reward != "posted" else None)

    async def run_due(self) -> None:
        if self.judge is not None and self._due("judge", self.settings.judge_idle_s, cap=5.0):
            await self.judge.run_once()
        if self._due("expiry", self.settings.reward_ttl_s, cap=60.0):
            await self.expire_unrewarded()
        if self._due("prune", self.settings.pruning.older_than, cap=3600.0):
            await self.prune_old()

    def _due(self, job: str, period: float, cap: float) -> bool:
        now = time.monotonic()
        if not period or now < self._next[job]:
            return False
        self._next[job] = now + min(cap, period / 10)
        return True

    async def _database_now(self):
        async with self.sessions() as session:
            return await database_now(session)

    async def expire_unrewarded(self) -> int:
        """Rollouts that waited longer than reward_ttl_s for a final reward become expired (never trained on)."""
        ttl = self.settings.reward_ttl_s
        cutoff = await self._database_now() - timedelta(seconds=ttl)  # rows' times are the database's
        expired = 0
        while True:
            async with self.sessions() as session, session.begin():
                batch = await expire_open_rollouts(session, cutoff, limit=EXPIRY_BATCH)
            expired += batch
            if batch < EXPIRY_BATCH:
                break
        if expired:
            self.metrics.rollouts_expired.inc(expired)
            log.info("%d rollouts expired: no final reward within %.0f s", expired, ttl)
        return expired

    async def prune_old(self) -> None:
        pruning = self.settings.pruning
        cutoff = await self._database_now() - timedelta(seconds=pruning.older_than)
        done = await prune(self.sessions, cutoff, what=pruning.what, keep_trained_ids=pruning.keep_trained_ids)
        self.metrics.pruned_rollouts.inc(done.rollouts)
        self.metrics.pruned_calls.inc(done.calls)
        self.metrics.pruned_bodies.inc(done.bodies)
        if not done.empty:
            log.info("pruned data older than %.0f s: %d rollouts, %d calls deleted, %d bodies cleared",
                     pruning.older_than, done.rollouts, done.calls, done.bodies)
