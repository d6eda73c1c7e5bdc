"""A rollout read back (`GET /rollouts/{id}`): its calls with token ids and logprobs, its rewards and events, in
the contract's JSON shape, one page of calls at a time. A page holds at most `MAX_PAGE` calls, in `seq` order,
after the `seq` the caller names; `next` is the `after` of the following page, or None on the last. A rollout
of up to `MAX_PAGE` calls read without paging is one page, as it was before pages existed. Each page carries
the rewards of its calls and those of the rollout as a whole (its final reward), so no reward is read twice
per page and none is left out of the pages together."""
from __future__ import annotations

from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from store.errors import NotFound
from store.models import Call, CallChoice, Reward, Rollout, RolloutEvent

MAX_PAGE = 1000  # calls per page (docs/contract.md): a page of agent calls stays tens of MiB at most


async def get_rollout(session: AsyncSession, rollout_id: str, *, project: str | None = None,
                      limit: int | None = None, after: int | None = None) -> dict[str, Any]:
    """The rollout with one page of its calls: at most `limit` (and `MAX_PAGE`) calls whose `seq` is above
    `after` (from the first without it), with their rewards and the rollout's own, and `next`."""
    rollout = await session.get(Rollout, rollout_id)
    if rollout is None or (project is not None and rollout.project not in (None, project)):
        raise NotFound(f"rollout {rollout_id!r} does not exist")
    page = min(limit or MAX_PAGE, MAX_PAGE)
    query = select(Call).where(Call.rollout_id == rollout_id)
    if after is not None:
        query = query.where(Call.seq > after)
    calls = list((await session.execute(query.order_by(Call.seq).limit(page + 1))).scalars())
    following = calls[page - 1].seq if len(calls) > page else None
    calls = calls[:page]
    choices: dict[str, list[CallChoice]] = {c.id: [] for c in calls}
    if calls:
        rows = await session.execute(
            select(CallChoice).where(CallChoice.call_id.in_(list(choices))).order_by(CallChoice.index))
        for choice in rows.scalars():
            choices[choice.call_id].append(choice)
    own = Reward.call_id.is_(None)
    rewards = (await session.execute(
        select(Reward).where(Reward.rollout_id == rollout_id, or_(own, Reward.call_id.in_(list(choices))) if calls
                             else own).order_by(Reward.id))).scalars()
    events = await rollout_events(session, rollout)
    metadata = dict(rollout.metadata_) if isinstance(rollout.metadata_, dict) else rollout.metadata_
    if events:
        metadata = {**(metadata or {}), "events": events}
    return {
        "rollout_id": rollout.id,
        "task_id": rollout.task_id,
        "agent": rollout.agent,
        "status": rollout.status,
        "reward": rollout.reward,
        "metadata": metadata,
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
        "next": following,
    }


async def rollout_events(session: AsyncSession, rollout: Rollout) -> list[Any]:
    """The rollout's events in the order they came: those kept in its metadata before migration 0008, then
    the rows of `rollout_events`."""
    rows = await session.execute(select(RolloutEvent.event_type, RolloutEvent.data, RolloutEvent.created_at)
                                 .where(RolloutEvent.rollout_id == rollout.id).order_by(RolloutEvent.id))
    return metadata_events(rollout) + [
        {"event_type": event_type, "data": data, "at": at.isoformat() if at else None} for event_type, data, at in rows]


def metadata_events(rollout: Rollout) -> list[Any]:
    """Events kept in the rollout's metadata (before migration 0008)."""
    events = rollout.metadata_.get("events") if isinstance(rollout.metadata_, dict) else None
    return list(events) if isinstance(events, list) else []


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
        "sampling": call.sampling,
        "request": call.request,
        "response": call.response,
        "error": call.error,
    }
