"""A batch whose step raises is tried once more, then set aside with its reason, and the trainer goes on.

Without this, one rollout the trainer cannot digest stops training for every project: the process exits, its
lease runs out, the batch is claimed again (oldest first) and raises again, every time. A failure caused by the
store or the disk is not the batch's: it propagates as before (the batch stays leased, then returns). Several
ranks (torchrun) are not guarded: a rank that failed may have left the others inside a collective, and only
exiting stops them.
"""
from __future__ import annotations

import asyncio

from sqlalchemy.exc import SQLAlchemyError

STEP_FAILED = "step_failed"
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
