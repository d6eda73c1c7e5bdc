"""Closing rollouts that will get no final reward, for policies that learn without one (a teacher: docs/distillation.md).

    closed = await close_idle(session, idle_before, policies=("default",))

A rollout is closed (finished, its reward NULL) when it is open, not evaluation traffic, not waiting for a grader's
or the judge's reward, one of `policies` answered one of its calls, and its agent has been silent since
`idle_before`: no call and no reward since then (the judge's notion of idle, store/judging.py). The trainer then
trains it from the teacher alone; a policy without a teacher counts its calls as no_reward.

    closed = await close_rollout(session, rollout_id, project=project, giver=RewardedBy.AGENT)

closes one rollout when its agent says it is done (`POST /rollouts/{id}/close`), with the same effect.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from store.dialect import database_now
from store.models import Call, Reward, Rollout, RolloutStatus
from store.reward_sources import RewardSource
from store.rollouts import may_reward, rollout_taking_rewards


async def close_idle(session: AsyncSession, idle_before: datetime, *, policies: Sequence[str],
                     limit: int = 512) -> list[str]:
    """Close the idle open rollouts `policies` answered in (at most `limit`); their ids."""
    last_call = func.max(func.coalesce(Call.finished_at, Call.started_at))
    recent_reward = select(Reward.id).where(Reward.rollout_id == Rollout.id, Reward.created_at >= idle_before)
    theirs = aliased(Call)  # the outer query's calls are its own FROM: this one must not correlate to them
    answered = select(theirs.id).where(theirs.rollout_id == Rollout.id, theirs.policy.in_(list(policies)))
    ids = list((await session.execute(
        select(Rollout.id).join(Call, Call.rollout_id == Rollout.id)
        .where(Rollout.status == RolloutStatus.OPEN, ~Rollout.eval, ~recent_reward.exists(), answered.exists(),
               # a grader or the judge gives its reward, however long its agent is silent: it waits for that
               or_(Rollout.reward_source.is_(None), Rollout.reward_source == RewardSource.AGENT))
        .group_by(Rollout.id).having(last_call < idle_before).order_by(last_call).limit(limit))).scalars())
    if not ids:
        return []
    now = await database_now(session)
    await session.execute(update(Rollout).where(Rollout.id.in_(ids), Rollout.status == RolloutStatus.OPEN)
                          .values(status=RolloutStatus.FINISHED, finished_at=now))
    return ids


@dataclass(frozen=True)
class Closed:
    """What `POST /rollouts/{id}/close` came to: the rollout's status after it, whether this request closed it, and
    `claim` when the caller does not give this rollout's end (its grader or judge does): then nothing changed."""
    rollout_id: str
    status: str
    closed: bool
    claim: bool = False


async def close_rollout(session: AsyncSession, rollout_id: str, *, project: str | None, giver: str) -> Closed:
    """Close a rollout without a final reward, as its idle timeout would: its agent is done and no reward is coming
    from it (a policy with a teacher trains it from the teacher; one without counts its calls as no_reward).
    `giver` (a RewardedBy) must be one who gives the rollout's reward (store/rollouts.py `may_reward`): an agent
    cannot end a rollout its verifier or judge is still to reward. Closing a closed rollout changes nothing.
    `NotFound` for another project's or no rollout, `Conflict` for an expired one."""
    rollout = await rollout_taking_rewards(session, rollout_id, project)
    if not may_reward(rollout, giver):
        return Closed(rollout_id, rollout.status, closed=False, claim=True)
    if rollout.status != RolloutStatus.OPEN:
        return Closed(rollout_id, rollout.status, closed=False)
    now = await database_now(session)
    done = await session.execute(update(Rollout).where(Rollout.id == rollout_id, Rollout.status == RolloutStatus.OPEN)
                                 .values(status=RolloutStatus.FINISHED, finished_at=now)
                                 .execution_options(synchronize_session="evaluate"))
    return Closed(rollout_id, RolloutStatus.FINISHED, closed=done.rowcount == 1)
