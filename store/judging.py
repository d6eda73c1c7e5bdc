"""What the trainer's judge (trainer/judge.py) asks of the store: rollouts that are done but were never given
a final reward, their recorded calls, and closing one with the judge's score; for judge+posted, holding posted
rollouts back from training until their score is weighed with the judge's."""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from rewards.judge import TRAJECTORY_CALLS, RecordedCall, combined_reward
from store import rewards as reward_rows
from store.errors import Conflict
from store.dialect import database_now
from store.models import Call, Reward, RewardKind, Rollout, RolloutStatus
from store.reward_sources import RewardSource
from store.rollouts import post_reward

JUDGE_REASON = "judge"  # rewards.reason of a final reward the judge gave
# judge+posted: the judge could not score a posted rollout, which then trains on its posted reward alone. A final
# reward row (its value the posted one, unchanged) so that the trainer's claim, which waits for the judge's word
# on every posted rollout, sees that word was given.
UNSCORED_REASON = "judge_unscored"


@dataclass(frozen=True, slots=True)
class IdleRollout:
    id: str
    task_id: str | None
    last_call_at: datetime
    posted: float | None = None  # judge+posted: the reward the agent posted
    # The tenant: groups never mix projects (trainer/judge.py `ready_groups`), since one relative prompt shows
    # every member's trajectory to the judge and its reply is stored with each member.
    project: str | None = None


async def idle_open_rollouts(session: AsyncSession, idle_before: datetime, *, skip: Collection[str] = (),
                             limit: int = 256) -> list[IdleRollout]:
    """Open (no final reward), non-evaluation rollouts with at least one call whose agent has been silent since
    `idle_before`: no call and no reward (one it posted for a call, or one its spans or tool results gave)
    since then. Least recently active first; `skip`: rollouts the judge has given up on."""
    last_call = func.max(func.coalesce(Call.finished_at, Call.started_at))
    recent_reward = select(Reward.id).where(Reward.rollout_id == Rollout.id, Reward.created_at >= idle_before)
    query = (select(Rollout.id, Rollout.task_id, last_call.label("last_call_at"), Rollout.project)
             .join(Call, Call.rollout_id == Rollout.id)
             .where(Rollout.status == RolloutStatus.OPEN, ~Rollout.eval, ~recent_reward.exists(),
                    # its grader gives its reward: the judge's would only be a claim
                    Rollout.reward_source.is_distinct_from(RewardSource.GRADER))
             .group_by(Rollout.id, Rollout.task_id, Rollout.project)
             .having(last_call < idle_before)
             .order_by(last_call).limit(limit))
    if skip:
        query = query.where(Rollout.id.notin_(list(skip)))
    return [IdleRollout(rollout_id, task_id, moment, project=project)
            for rollout_id, task_id, moment, project in (await session.execute(query)).all()]


async def recorded_calls(session: AsyncSession, rollout_ids: list[str],
                         max_calls: int = TRAJECTORY_CALLS) -> dict[str, list[RecordedCall]]:
    """rollout id -> its calls (every status: a failed call is part of what the agent went through), in order:
    the latest `max_calls` of each. The bound is in the query, so a runaway agent's thousands of calls are never
    loaded (their bodies are the largest thing in the store); the latest call resends the history anyway."""
    latest_first = func.row_number().over(partition_by=Call.rollout_id,
                                          order_by=(Call.seq.desc().nulls_first(), Call.started_at.desc()))
    ranked = (select(Call.rollout_id, Call.route, Call.request, Call.response, Call.agent,
                     latest_first.label("rank"))
              .where(Call.rollout_id.in_(rollout_ids)).subquery())
    rows = await session.execute(
        select(ranked.c.rollout_id, ranked.c.route, ranked.c.request, ranked.c.response, ranked.c.agent)
        .where(ranked.c.rank <= max_calls).order_by(ranked.c.rollout_id, ranked.c.rank.desc()))
    calls: dict[str, list[RecordedCall]] = {rollout_id: [] for rollout_id in rollout_ids}
    for rollout_id, route, request, response, agent in rows:
        calls[rollout_id].append(RecordedCall(route, request, response, agent))
    return calls


async def close_with_judge_score(session: AsyncSession, rollout_id: str, score: float,
                                 metadata: dict[str, Any]) -> bool:
    """Give a rollout the judge's score as its final reward, exactly as `POST /reward` would (the rollout
    becomes finished and trainable). False when it was closed meanwhile — a reward the agent posted after
    all, or expiry — which then stands."""
    try:
        result = await post_reward(session, rollout_id, score, metadata=metadata, reason=JUDGE_REASON)
    except Conflict:
        return False
    return result.created


# --- judge+posted: rollouts with a posted reward wait for the judge too -------------------------------------


def judge_had_its_say():
    """A condition on `Rollout`: the judge scored it, or (judge+posted) gave up on it. Under judge+posted the
    trainer claims only such rollouts, so a reward posted after the judge's last look is never trained unweighed."""
    return select(Reward.id).where(Reward.rollout_id == Rollout.id, Reward.kind == RewardKind.FINAL,
                                   Reward.reason.in_((JUDGE_REASON, UNSCORED_REASON))).exists()


def _unjudged_posted(owner: str, now: datetime):
    unleased = or_(Rollout.lease_owner.is_(None), Rollout.lease_owner == owner, Rollout.lease_expires_at < now)
    return and_(Rollout.status == RolloutStatus.FINISHED, Rollout.trained_at.is_(None), ~Rollout.eval,
                unleased, ~judge_had_its_say())


async def hold_posted(session: AsyncSession, owner: str, seconds: float, *, skip: Collection[str] = ()) -> int:
    """Lease the finished, untrained rollouts whose posted reward the judge has not weighed yet to `owner`, so
    the trainer does not claim them first (its claim skips leased rollouts). Renewed on every run."""
    now = await database_now(session)  # the trainer compares the lease's end with the database's clock too
    query = update(Rollout).where(_unjudged_posted(owner, now)).values(
        lease_owner=owner, lease_expires_at=now + timedelta(seconds=seconds))
    if skip:
        query = query.where(Rollout.id.notin_(list(skip)))
    return (await session.execute(query)).rowcount or 0


async def held_posted_rollouts(session: AsyncSession, owner: str, idle_before: datetime,
                               limit: int = 256) -> list[IdleRollout]:
    """The rollouts `hold_posted` holds whose last call is before `idle_before`, with their posted reward."""
    last_call = func.max(func.coalesce(Call.finished_at, Call.started_at))
    rows = await session.execute(
        select(Rollout.id, Rollout.task_id, last_call, Rollout.reward, Rollout.project)
        .join(Call, Call.rollout_id == Rollout.id)
        .where(_unjudged_posted(owner, await database_now(session)), Rollout.lease_owner == owner)
        .group_by(Rollout.id, Rollout.task_id, Rollout.reward, Rollout.project).having(last_call < idle_before)
        .order_by(last_call).limit(limit))
    return [IdleRollout(rollout_id, task_id, moment, posted, project)
            for rollout_id, task_id, moment, posted, project in rows]


async def weigh_posted_with_judge(session: AsyncSession, rollout_id: str, owner: str, score: float,
                                  weight: float, metadata: dict[str, Any]) -> bool:
    """judge+posted for a rollout `owner` holds: its reward becomes the weighted sum of the judge's score and the
    posted one (both kept as final reward rows), and the hold is released so the trainer may claim it."""
    query = select(Rollout).where(Rollout.id == rollout_id).with_for_update()
    rollout = (await session.execute(query)).scalar_one_or_none()
    if (rollout is None or rollout.lease_owner != owner or rollout.status != RolloutStatus.FINISHED
            or rollout.trained_at is not None):
        return False  # released (it waited too long) or taken meanwhile: its posted reward stands
    posted = float(rollout.reward)
    combined = combined_reward(score, posted, weight)
    reward_rows.add_final(session, rollout_id, score, reason=JUDGE_REASON,
                          metadata={**metadata, "posted": posted, "weight": weight, "combined": combined})
    rollout.reward = combined
    rollout.lease_owner = rollout.lease_expires_at = None
    return True


async def release_held(session: AsyncSession, rollout_ids: list[str], owner: str, why: str = "") -> int:
    """Give up on weighing these: they train on their posted reward alone, which a `judge_unscored` final reward
    row (the posted value, `why` in its metadata) records. Returns how many were released. The rollout's tenant
    reads that row (GET /rollouts/{id}): `why` is an outcome code (trainer/judge.py), never the judge's URL, its
    error body or its reply, which may quote another trajectory."""
    held = (await session.execute(
        select(Rollout.id, Rollout.reward).where(Rollout.id.in_(rollout_ids), Rollout.lease_owner == owner,
                                                 Rollout.status == RolloutStatus.FINISHED, Rollout.trained_at.is_(None))
        .with_for_update())).all()
    for rollout_id, posted in held:
        reward_rows.add_final(session, rollout_id, posted, reason=UNSCORED_REASON,
                              metadata={"source": "judge", "scored": False, "why": why[:500]})
    await session.execute(update(Rollout).where(Rollout.id.in_(rollout_ids), Rollout.lease_owner == owner)
                          .values(lease_owner=None, lease_expires_at=None))
    return len(held)
