"""Rollouts and their rewards: creation, the final and intermediate rewards (the read-back is in
store/rollout_view.py, re-exported here)."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from core.checks import reward_problem
from store import rewards as reward_rows
from store.dialect import database_now
from store.errors import Conflict, NotFound, NotYours
from store.models import Call, Rollout, RolloutStatus, as_utc, utcnow
from store.reward_sources import RewardedBy, RewardSource
from store.rollout_view import get_rollout

JUDGE_REASON = "judge"  # a final reward's `reason` when the trainer's judge gave it (store/judging.py)


@dataclass(slots=True, frozen=True)
class RewardResult:
    rollout_id: str
    reward: float
    call_id: str | None
    created: bool  # False when an identical final reward was already stored
    policy_version: int | None = None  # the version that served the rollout
    eval: bool = False  # evaluation traffic (never trained on)
    claim: bool = False  # kept as a claim beside the rollout's reward (who posted it does not give it)


async def create_rollout(
    session: AsyncSession,
    rollout_id: str,
    *,
    task_id: str | None = None,
    agent: str | None = None,
    metadata: dict[str, Any] | None = None,
    project: str | None = None,
    policy_version: int | None = None,
    eval: bool = False,
    reward_source: str = RewardSource.AGENT,
    token_hash: str | None = None,
    grader_token_hash: str | None = None,
) -> Rollout:
    rollout = Rollout(id=rollout_id, task_id=task_id, agent=agent, metadata_=metadata, project=project,
                      policy_version=policy_version, status=RolloutStatus.OPEN, call_count=0, eval=eval,
                      reward_source=reward_source, token_hash=token_hash, grader_token_hash=grader_token_hash,
                      created_at=await database_now(session))  # the reward TTL's clock (store/dialect.py)
    session.add(rollout)
    await session.flush()
    return rollout


async def _rollout_for_update(session: AsyncSession, rollout_id: str, project: str | None) -> Rollout:
    query = select(Rollout).where(Rollout.id == rollout_id).with_for_update()
    rollout = (await session.execute(query)).scalar_one_or_none()
    if rollout is None or (project is not None and rollout.project not in (None, project)):
        raise NotFound(f"rollout {rollout_id!r} does not exist")
    if project is not None and rollout.project is None:  # every key reads it; only the operator writes to it
        raise NotYours(rollout_id)
    return rollout


async def rollout_kind(session: AsyncSession, rollout_id: str) -> tuple[bool, str | None] | None:
    """(created as evaluation, agent) of the rollout; None when there is none."""
    row = (await session.execute(select(Rollout.eval, Rollout.agent).where(Rollout.id == rollout_id))).first()
    return (bool(row[0]), row[1]) if row is not None else None


async def rollout_taking_rewards(session: AsyncSession, rollout_id: str, project: str | None) -> Rollout:
    """The rollout, locked until the transaction ends: `NotFound` if it does not exist (or is another project's),
    `Conflict` once it has expired (it takes no more rewards)."""
    rollout = await _rollout_for_update(session, rollout_id, project)
    if rollout.status == RolloutStatus.EXPIRED:
        raise _expired(rollout)
    return rollout


def taken(rollout: Rollout, now: datetime | None = None) -> str | None:
    """Why a reward for one of the rollout's calls would be stored and never used (a training step has it or had
    it, and read the calls' rewards when it took it), or None. The final reward is no matter here: the same value
    again is a no-op whenever it comes. `now`: the database's (a lease's end is), else this machine's."""
    if rollout.trained_at is not None:
        return (f"rollout {rollout.id!r} was trained at {rollout.trained_at:%Y-%m-%d %H:%M:%S} UTC; a reward for one "
                "of its calls now would never be used (send per-call rewards before the final one)")
    if rollout.lease_owner is not None and rollout.lease_expires_at is not None \
            and as_utc(rollout.lease_expires_at) > (now or utcnow()):
        return (f"rollout {rollout.id!r} is being trained; a reward for one of its calls now would not be used "
                "(send per-call rewards before the final one)")
    return None


def sealed(rollout: Rollout) -> bool:
    """Whether the rollout takes its rewards only from its reward source: created with a source other than the
    agent (`POST /rollouts` gives every evaluation rollout its grader). One marked as evaluation later (the
    `X-Rlproxy-Eval` header, `--eval-agents`) is not: its agent's reward closes it, and is no evidence
    (store/evaluation.py counts what an evaluation credential rewarded)."""
    return rollout.reward_source not in (None, RewardSource.AGENT)


def may_reward(rollout: Rollout, giver: str) -> bool:
    """Whether `giver` (a RewardedBy) gives this rollout's rewards, or only claims them."""
    if not sealed(rollout):
        return True
    if rollout.reward_source == RewardSource.JUDGE:
        return giver == RewardedBy.JUDGE
    return giver in RewardedBy.EVIDENCE


def _expired(rollout: Rollout) -> Conflict:
    return Conflict(f"rollout {rollout.id!r} expired at {rollout.finished_at:%Y-%m-%d %H:%M:%S} UTC without a "
                    f"final reward (the trainer's reward TTL); it takes no more rewards")


async def post_reward(
    session: AsyncSession,
    rollout_id: str,
    value: float,
    *,
    call_id: str | None = None,
    task_id: str | None = None,
    metadata: dict[str, Any] | None = None,
    project: str | None = None,
    reason: str | None = None,
    giver: str = RewardedBy.AGENT,
) -> RewardResult:
    """A final reward (no `call_id`) closes the rollout; the same value again is a no-op, another is a
    `Conflict`. With `call_id` it is an intermediate reward for that call of the rollout. `reason` names who
    gave a final reward other than the agent (the trainer's judge: "judge"); `giver` (a RewardedBy) who posted
    it: a rollout whose reward source is not its agent keeps a reward from anyone else as a claim (`claim` in
    the result), which neither closes it nor is ever trained on."""
    if problem := reward_problem(value):  # every door checks first; this is the last line
        raise ValueError(problem)
    if reason == JUDGE_REASON:
        giver = RewardedBy.JUDGE
    rollout = await rollout_taking_rewards(session, rollout_id, project)
    if call_id is not None:
        owner = (await session.execute(select(Call.rollout_id).where(Call.id == call_id))).scalar_one_or_none()
        if owner != rollout_id:
            raise NotFound(f"call {call_id!r} is not part of rollout {rollout_id!r}")
    if not may_reward(rollout, giver):
        stored = await reward_rows.add_claim(session, rollout_id, value, call_id=call_id, giver=giver,
                                             metadata=metadata)
        return RewardResult(rollout_id, value, call_id, stored, rollout.policy_version, rollout.eval, claim=True)
    if call_id is not None:
        if await reward_rows.has_call_reward(session, call_id, value, metadata):  # a retry: already stored
            return RewardResult(rollout_id, value, call_id, False)
        if why := taken(rollout, await database_now(session)):
            raise Conflict(why)
        reward_rows.add_call_reward(session, rollout_id, call_id, value, metadata)
        return RewardResult(rollout_id, value, call_id, True)

    closing = {"status": RolloutStatus.FINISHED, "reward": value, "finished_at": await database_now(session),
               "rewarded_by": giver}
    if task_id is not None and rollout.task_id is None:
        closing["task_id"] = task_id
    # Closed only if still open, in one statement: the lock above is a no-op on SQLite, where another request
    # may have closed the rollout since it was read; the loser then answers from what the winner stored.
    still_open = (Rollout.id == rollout_id) & (Rollout.status == RolloutStatus.OPEN)
    closed = await session.execute(update(Rollout).where(still_open).values(closing)
                                   .execution_options(synchronize_session="evaluate"))
    if closed.rowcount != 1:
        await session.refresh(rollout)
        if rollout.status == RolloutStatus.EXPIRED:
            raise _expired(rollout)
        if rollout.reward == value:
            return RewardResult(rollout_id, value, None, False, rollout.policy_version, rollout.eval)
        if rollout.reward is None:  # store/closing.py: a policy with a teacher trains it without one
            raise Conflict(f"rollout {rollout_id!r} was closed without a final reward (POST /rollouts/{{id}}/close, "
                           "or its agent was silent past rlproxy train --teacher-idle-s), so it takes none now")
        raise Conflict(f"rollout {rollout_id!r} already has final reward {rollout.reward}, not {value}")
    reward_rows.add_final(session, rollout_id, value, reason=reason, metadata=metadata)
    try:
        await session.flush()
    except IntegrityError:  # uq_rewards_final: a final reward stored by a path that bypassed the update above
        raise Conflict(f"rollout {rollout_id!r} already has a final reward") from None
    return RewardResult(rollout_id, value, None, True, rollout.policy_version, rollout.eval)


async def expire_open_rollouts(session: AsyncSession, created_before: datetime, limit: int = 1000) -> int:
    """Mark up to `limit` open rollouts created before `created_before` as expired (oldest first); their count.
    Batched, so a backlog never holds one long transaction over the rollouts table."""
    oldest = (select(Rollout.id).where(Rollout.status == RolloutStatus.OPEN, Rollout.created_at < created_before)
              .order_by(Rollout.created_at).limit(limit))
    ids = list((await session.execute(oldest)).scalars())
    if not ids:
        return 0
    result = await session.execute(
        update(Rollout).where(Rollout.id.in_(ids), Rollout.status == RolloutStatus.OPEN)
        .values(status=RolloutStatus.EXPIRED, finished_at=await database_now(session)))
    return result.rowcount or 0


__all__ = ["JUDGE_REASON", "RewardResult", "create_rollout", "may_reward", "sealed", "expire_open_rollouts", "get_rollout", "post_reward",
           "rollout_taking_rewards"]
