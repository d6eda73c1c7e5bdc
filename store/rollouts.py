"""Rollouts and their rewards: creation, the final and intermediate rewards, and the full read-back."""
from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from store import rewards as reward_rows
from store.errors import Conflict, NotFound
from store.models import Call, CallChoice, Reward, RewardKind, Rollout, RolloutStatus, utcnow


@dataclass(slots=True, frozen=True)
class RewardResult:
    rollout_id: str
    reward: float
    call_id: str | None
    created: bool  # False when an identical final reward was already stored
    policy_version: int | None = None  # the version that served the rollout
    eval: bool = False  # evaluation traffic (never trained on)


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
) -> Rollout:
    rollout = Rollout(id=rollout_id, task_id=task_id, agent=agent, metadata_=metadata, project=project,
                      policy_version=policy_version, status=RolloutStatus.OPEN, call_count=0, eval=eval)
    session.add(rollout)
    await session.flush()
    return rollout


async def _rollout_for_update(session: AsyncSession, rollout_id: str, project: str | None) -> Rollout:
    query = select(Rollout).where(Rollout.id == rollout_id).with_for_update()
    rollout = (await session.execute(query)).scalar_one_or_none()
    if rollout is None or (project is not None and rollout.project not in (None, project)):
        raise NotFound(f"rollout {rollout_id!r} does not exist")
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
) -> RewardResult:
    """A final reward (no `call_id`) closes the rollout; the same value again is a no-op, another is a
    `Conflict`. With `call_id` it is an intermediate reward for that call of the rollout. `reason` names who
    gave a final reward other than the agent (the trainer's judge: "judge")."""
    if not math.isfinite(value):
        raise ValueError("reward must be a finite number")
    rollout = await rollout_taking_rewards(session, rollout_id, project)
    if call_id is not None:
        owner = (await session.execute(select(Call.rollout_id).where(Call.id == call_id))).scalar_one_or_none()
        if owner != rollout_id:
            raise NotFound(f"call {call_id!r} is not part of rollout {rollout_id!r}")
        reward_rows.add_call_reward(session, rollout_id, call_id, value, metadata)
        return RewardResult(rollout_id, value, call_id, True)

    closing = {"status": RolloutStatus.FINISHED, "reward": value, "finished_at": utcnow()}
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
        .values(status=RolloutStatus.EXPIRED, finished_at=utcnow()))
    return result.rowcount or 0


async def get_rollout(session: AsyncSession, rollout_id: str, *, project: str | None = None) -> dict[str, Any]:
    """The rollout with its calls (token ids, logprobs) and rewards, in the contract's JSON shape."""
    rollout = await session.get(Rollout, rollout_id)
    if rollout is None or (project is not None and rollout.project not in (None, project)):
        raise NotFound(f"rollout {rollout_id!r} does not exist")
    calls = (await session.execute(select(Call).where(Call.rollout_id == rollout_id).order_by(Call.seq))).scalars()
    calls = list(calls)
    choices: dict[str, list[CallChoice]] = {c.id: [] for c in calls}
    if calls:
        rows = await session.execute(
            select(CallChoice).where(CallChoice.call_id.in_(list(choices))).order_by(CallChoice.index)
        )
        for choice in rows.scalars():
            choices[choice.call_id].append(choice)
    rewards = (
        await session.execute(select(Reward).where(Reward.rollout_id == rollout_id).order_by(Reward.id))
    ).scalars()
    return {
        "rollout_id": rollout.id,
        "task_id": rollout.task_id,
        "agent": rollout.agent,
        "status": rollout.status,
        "reward": rollout.reward,
        "metadata": rollout.metadata_,
        "created_at": rollout.created_at.isoformat() if rollout.created_at else None,
        "finished_at": rollout.finished_at.isoformat() if rollout.finished_at else None,
        "trained": rollout.trained_at is not None,
        "eval": rollout.eval,
        "policy": rollout.policy_version,
        "calls": [call_json(call, choices[call.id]) for call in calls],
        "rewards": [
            {"call_id": r.call_id, "kind": r.kind, "value": r.value, "reason": r.reason, "metadata": r.metadata_,
             "created_at": r.created_at.isoformat() if r.created_at else None}
            for r in rewards
        ],
    }


def call_json(call: Call, choices: list[CallChoice]) -> dict[str, Any]:
    first = choices[0] if choices else None
    return {
        "call_id": call.id,
        "seq": call.seq,
        "agent": call.agent,
        "model": call.model,
        "policy": call.policy_version,
        "policy_name": call.policy,
        "status": call.status,
        "http_status": call.http_status,
        "stream": call.stream,
        "route": call.route,
        "prompt_token_ids": call.prompt_token_ids,
        "completion_token_ids": first.token_ids if first else None,
        "completion_logprobs": first.logprobs if first else None,
        "finish_reason": first.finish_reason if first else None,
        "choices": [
            {"index": c.index, "token_ids": c.token_ids, "logprobs": c.logprobs, "finish_reason": c.finish_reason}
            for c in choices
        ],
        "prefix_kind": call.prefix_kind,
        "prefix_parent_id": call.prefix_parent_id,
        "latency_ms": call.latency_ms,
        "ttft_ms": call.ttft_ms,
        "request": call.request,
        "response": call.response,
        "error": call.error,
    }
