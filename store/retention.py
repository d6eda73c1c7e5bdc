"""Retention: what is recorded past an age is deleted in small batches, each its own short transaction, so the
proxy's writes never wait long behind it (datasette's rule: one writer, short writes).

What may go: rollouts that are done with — trained, expired, or finished evaluation rollouts — and calls made
outside any rollout. What never goes: open rollouts and finished training rollouts the trainer has not consumed
yet (accepted training data is never lost to retention). `bodies` keeps every row and clears only the request
and response bodies of those calls (the bulk of the table), keeping token ids, logprobs and rewards;
`keep_trained_ids` deletes the rest but treats trained rollouts as `bodies` does, so `rlproxy export` can still
rebuild what was trained on.

Each rollout deleted leaves a tombstone, its id in `pruned_rollouts` (migration 0012): a call of it that waited in a
proxy's spool meanwhile is set aside when it arrives (store/calls.py) rather than bring the rollout back as a new,
open one numbered from 1 again. A tombstone is an id and a time, kept for good (a spool can wait any time)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from sqlalchemy import and_, delete, false, func, null, or_, select, true, update
from sqlalchemy.ext.asyncio import AsyncSession

from store.dialect import database_now, insert_ignoring_duplicates
from store.models import Call, CallChoice, PrunedRollout, Reward, Rollout, RolloutStatus

What = Literal["calls", "bodies"]


@dataclass
class Pruned:
    rollouts: int = 0  # rollouts deleted with their calls and rewards
    calls: int = 0  # calls deleted (those of deleted rollouts and those made outside any rollout)
    bodies: int = 0  # calls whose request and response bodies were cleared

    def add(self, other: Pruned) -> None:
        self.rollouts += other.rollouts
        self.calls += other.calls
        self.bodies += other.bodies

    @property
    def empty(self) -> bool:
        return not (self.rollouts or self.calls or self.bodies)


def _done_with(created_before: datetime):
    """Rollouts retention may take: created before the cutoff, and trained, expired or finished evaluation."""
    return and_(Rollout.created_at < created_before,
                or_(Rollout.trained_at.is_not(None), Rollout.status == RolloutStatus.EXPIRED,
                    and_(Rollout.eval, Rollout.status == RolloutStatus.FINISHED)))


CALLS_PER_ROLLOUT = 20  # a batch of `limit` rollouts touches at most limit x this many calls (at least one rollout)


def _oldest(condition, limit: int):
    """The ids of the oldest rollouts matching `condition`: at most `limit`, and no more than their calls allow
    (`limit * CALLS_PER_ROLLOUT` in all, one rollout at least): rollouts of thousands of calls each would
    otherwise make one transaction of millions of rows, holding SQLite's one write lock past its busy timeout."""
    first = (select(Rollout.id, Rollout.created_at, Rollout.call_count).where(condition)
             .order_by(Rollout.created_at, Rollout.id).limit(limit).subquery())
    order = (first.c.created_at, first.c.id)
    ranked = select(first.c.id, func.sum(first.c.call_count).over(order_by=order).label("calls"),
                    func.row_number().over(order_by=order).label("place")).subquery()
    return select(ranked.c.id).where(or_(ranked.c.calls <= limit * CALLS_PER_ROLLOUT, ranked.c.place == 1))


def _has_bodies():
    return or_(Call.request.is_not(None), Call.response.is_not(None))


async def prune_batch(session: AsyncSession, created_before: datetime, *, what: What = "calls",
                      keep_trained_ids: bool = False, limit: int = 500) -> Pruned:
    """One batch: at most `limit` rollouts of each kind and `limit` calls outside rollouts. Run it until it
    comes back empty."""
    done = Pruned()
    bodies_only = what == "bodies"
    kept_whole = true() if bodies_only else (Rollout.trained_at.is_not(None) if keep_trained_ids else false())
    clear = _oldest(and_(_done_with(created_before), kept_whole,
                         Rollout.id.in_(select(Call.rollout_id).where(_has_bodies()))), limit)
    clear_ids = list((await session.execute(clear)).scalars())
    if clear_ids:
        cleared = await session.execute(
            update(Call).where(Call.rollout_id.in_(clear_ids), _has_bodies()).values(request=null(), response=null()))
        done.bodies += cleared.rowcount or 0
    if not bodies_only:
        drop = _oldest(and_(_done_with(created_before), ~kept_whole), limit)
        drop_ids = list((await session.execute(drop)).scalars())
        if drop_ids:
            calls = select(Call.id).where(Call.rollout_id.in_(drop_ids))
            await session.execute(delete(CallChoice).where(CallChoice.call_id.in_(calls)))
            await session.execute(delete(Reward).where(Reward.rollout_id.in_(drop_ids)))
            done.calls += (await session.execute(delete(Call).where(Call.rollout_id.in_(drop_ids)))).rowcount or 0
            done.rollouts += (await session.execute(delete(Rollout).where(Rollout.id.in_(drop_ids)))).rowcount or 0
            pruned_at = await database_now(session)
            await session.execute(insert_ignoring_duplicates(session, PrunedRollout.__table__, ["id"]),
                                  [{"id": rid, "pruned_at": pruned_at} for rid in drop_ids])
    loose = select(Call.id).where(Call.rollout_id.is_(None), Call.started_at < created_before)
    if bodies_only:
        loose_ids = list((await session.execute(loose.where(_has_bodies()).limit(limit))).scalars())
        if loose_ids:
            cleared = await session.execute(update(Call).where(Call.id.in_(loose_ids)).values(request=null(),
                                                                                              response=null()))
            done.bodies += cleared.rowcount or 0
    else:
        loose_ids = list((await session.execute(loose.limit(limit))).scalars())
        if loose_ids:
            await session.execute(delete(CallChoice).where(CallChoice.call_id.in_(loose_ids)))
            await session.execute(delete(Reward).where(Reward.call_id.in_(loose_ids)))
            done.calls += (await session.execute(delete(Call).where(Call.id.in_(loose_ids)))).rowcount or 0
    return done


async def prune(sessions, created_before: datetime, *, what: What = "calls", keep_trained_ids: bool = False,
                batch: int = 500, pause_s: float = 0.05) -> Pruned:
    """Every batch until none is left, each in its own transaction with a pause between them (serving's writes
    get the database in between)."""
    total = Pruned()
    while True:
        async with sessions() as session, session.begin():
            done = await prune_batch(session, created_before, what=what, keep_trained_ids=keep_trained_ids,
                                     limit=batch)
        total.add(done)
        if done.empty:
            return total
        await asyncio.sleep(pause_s)
