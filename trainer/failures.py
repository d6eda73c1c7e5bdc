"""A batch whose step raises is tried once more, then set aside with its reason, and the trainer goes on.

Without this, one rollout the trainer cannot digest stops training for every project: the process exits, its
lease runs out, the batch is claimed again (oldest first) and raises again, every time. A failure caused by the
store or the disk is not the batch's: it propagates as before (the batch stays leased, then returns).

Several ranks (torchrun) cannot catch a failure and go on: a rank that raised (a CUDA OOM on one long
transition, say) may have left the others inside a collective, and only exiting stops them. So every step is
counted on its rollouts in the store before it runs (`StepAttempts.begin`), and the failure rank 0 saw is noted
on them; every rank exits and the chart (or whatever runs `rlproxy train`) starts them again; the restarted trainer
sets aside, before it claims anything, the rollouts of its earlier runs whose steps began twice and never
finished, recorded as a step that trained nothing, with the error, counted as step_failed. A batch that fails
once (a peer lost to something else) is tried once more, as in one process; a trainer killed twice during
the same batch's step (an eviction, say) sets that batch aside too. One process counts no attempts: it catches
its step's failure itself.
"""
from __future__ import annotations

import asyncio
import logging

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from store import training
from trainer.metrics import TrainerMetrics

log = logging.getLogger("rlproxy.trainer")

STEP_FAILED = "step_failed"
ATTEMPTS = 2  # steps begun over a rollout that never finished, before it is set aside
UNFINISHED = "the step did not finish on every rank (a rank raised, ran out of memory or was killed: its log says)"
NOT_THE_BATCH = (OSError, asyncio.TimeoutError, SQLAlchemyError)  # the store or the disk, not the rollouts


class FailedBatches:
    """The rollouts of batches that failed once in this process."""

    def __init__(self) -> None:
        self._failed: set[str] = set()

    def failed_before(self, rollout_ids: list[str]) -> bool:
        """Note a failure of the batch `rollout_ids`; True when one of them was in a batch that failed already."""
        again = not self._failed.isdisjoint(rollout_ids)
        self._failed.update(rollout_ids)
        return again


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


class StepAttempts:
    """Steps begun over rollouts, counted in the store, so that several ranks set a failing batch aside too."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], worker_id: str, lease_owner: str,
                 metrics: TrainerMetrics) -> None:
        self.sessions, self.worker_id, self.lease_owner, self.metrics = sessions, worker_id, lease_owner, metrics

    async def begin(self, rollout_ids: list[str]) -> None:
        async with self.sessions() as session, session.begin():
            await training.begin_attempt(session, rollout_ids, self.lease_owner)

    async def failed(self, rollout_ids: list[str], exc: BaseException) -> None:
        """Note the error on the rollouts, if the store answers (the process exits next either way)."""
        try:
            async with self.sessions() as session, session.begin():
                await training.note_step_error(session, rollout_ids, describe(exc))
        except Exception:  # noqa: BLE001 — the step's own error is what the log must show
            log.exception("could not note the step's error on its %d rollouts", len(rollout_ids))

    async def set_aside_unfinished(self) -> int:
        """Before the first claim: record the rollouts an earlier run's steps failed on ATTEMPTS times as a step
        that trained nothing (they are never claimed again). Returns how many."""
        async with self.sessions() as session, session.begin():
            failed = await training.unfinished_attempts(session, self.worker_id, ATTEMPTS)
            for error, rollout_ids in failed.items():
                await training.record_step(session, rollout_ids, self.lease_owner, policy_version=None,
                                           transition_count=0, metrics={"failed": error or UNFINISHED,
                                                                        "skipped": {STEP_FAILED: len(rollout_ids)}})
        count = sum(map(len, failed.values()))
        for error, rollout_ids in failed.items():
            self.metrics.skipped.labels(STEP_FAILED).inc(len(rollout_ids))
            log.error("ALERT: %d rollouts were in steps that did not finish %d times (%s); they are set aside as "
                      "%s, recorded in the step record, and training goes on", len(rollout_ids), ATTEMPTS,
                      error or UNFINISHED, STEP_FAILED)
        return count
