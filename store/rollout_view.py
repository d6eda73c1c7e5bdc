"""A rollout read back (`GET /rollouts/{id}`): its calls with token ids and logprobs, its rewards and events, in
the contract's JSON shape, one page of calls at a time. A page holds at most `MAX_PAGE` calls, in `seq` order,
after the `seq` the caller names; `next` is the `after` of the following page, or None on the last. A rollout
of up to `MAX_PAGE` calls read without paging is one page, as it was before pages existed. Each page carries
the rewards of its calls and those of the rollout as a whole (its final reward), so no reward is read twice
per page and none is left out of the pages together. The summary form (`with_calls=False`) reads no call: their
count, the versions that answered and their statuses."""
from __future__ import annotations

from typing import Any

from sqlalchemy import BLOB, Text, cast, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from store.errors import NotFound
from store.models import Call, CallChoice, Reward, RewardKind, Rollout, RolloutEvent

MAX_PAGE = 1000  # calls per page (docs/contract.md)
# A page asked for with `max_bytes` (the web view: PAGE_BYTES) also ends once its calls' stored size passes the
# bound: a call's request and response are whatever the agent sent and the engine answered, up to the body limit
# (64 MiB) each, so a page bounded by call count alone is bounded by nothing a server can hold or a browser show.
PAGE_BYTES = 8 * 1024 * 1024
# Calls measured per query: the database renders each measured body as text to measure it (about 200 MB/s), so the
# first query measures few, and later ones about as many as the calls seen so far say still fit.
FIRST_CHUNK = 4
MAX_CHUNK = 64
CALL_OVERHEAD = 1024  # bytes of a call's JSON besides its bodies and token lists (ids, times, route, ...)


async def get_rollout(session: AsyncSession, rollout_id: str, *, project: str | None = None,
                      limit: int | None = None, after: int | None = None, max_bytes: int | None = None,
                      with_metadata: bool = True, with_calls: bool = True) -> dict[str, Any]:
    """The rollout with one page of its calls: at most `limit` (and `MAX_PAGE`) calls whose `seq` is above
    `after` (from the first without it), with their rewards and the rollout's own, and `next`. With `max_bytes`,
    the page also ends before the call that would take its stored size past `max_bytes` (it holds one call at
    least). Without `with_metadata`, `metadata` is None and the events are not read (a later page's caller has
    them from the first). Without `with_calls`, no call is read: `calls` is empty, the rewards are the
    rollout's own, and `summary` says what the calls came to (`calls_summary`)."""
    rollout = await session.get(Rollout, rollout_id)
    if rollout is None or (project is not None and rollout.project not in (None, project)):
        raise NotFound(f"rollout {rollout_id!r} does not exist")
    page = min(limit or MAX_PAGE, MAX_PAGE)
    summary = None
    if not with_calls:
        calls, following = [], None
        summary = await calls_summary(session, rollout_id)
    elif max_bytes is None:
        query = select(Call).where(Call.rollout_id == rollout_id)
        if after is not None:
            query = query.where(Call.seq > after)
        calls = list((await session.execute(query.order_by(Call.seq).limit(page + 1))).scalars())
        following = calls[page - 1].seq if len(calls) > page else None
        calls = calls[:page]
    else:
        calls, following = await _calls_within(session, rollout_id, after, page, max_bytes)
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
    metadata = None
    if with_metadata:
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
        "reward_source": rollout.reward_source or "agent",
        "rewarded_by": rollout.rewarded_by,
        "policy": rollout.policy_version,
        "calls": [call_json(call, choices[call.id]) for call in calls],
        "rewards": [
            {"call_id": r.call_id, "kind": r.kind, "claim": r.kind == RewardKind.CLAIM, "value": r.value,
             "reason": r.reason, "metadata": r.metadata_,
             "created_at": r.created_at.isoformat() if r.created_at else None}
            for r in rewards
        ],
        "next": following,
        **({"summary": summary} if summary is not None else {}),
    }


def _stored_size(dialect: str):
    """A call's size in its JSON form, as the database can tell it without sending the call: its bodies as text,
    its error, and its token lists (prompt ids; each completion token twice, as an id and a log-prob, in
    `completion_*` and in `choices`). Not `pg_column_size`: that is the compressed size, and a body of one
    repeated character compresses a hundredfold."""
    if dialect == "postgresql":
        def length(column):
            return func.coalesce(func.octet_length(cast(column, Text)), 0)
        prompt = func.coalesce(func.cardinality(Call.prompt_token_ids), 0)
    else:  # SQLite keeps JSON as text; length() of a BLOB counts bytes
        def length(column):
            return func.coalesce(func.length(cast(column, BLOB)), 0)
        prompt = func.coalesce(func.json_array_length(Call.prompt_token_ids), 0)
    return (length(Call.request) + length(Call.response) + length(Call.error) + 8 * prompt
            + 48 * func.coalesce(Call.completion_tokens, 0) + CALL_OVERHEAD)


async def _calls_within(session: AsyncSession, rollout_id: str, after: int | None, page: int,
                        max_bytes: int) -> tuple[list[Call], int | None]:
    """The calls after `after`, in `seq` order, up to `page` of them and `max_bytes` of stored size (one call at
    least), and the `next` cursor. Sizes are measured a few calls at a time, so a page of large calls renders few
    bodies past its end in the database to find out, whatever `page` is."""
    size = _stored_size(session.get_bind().dialect.name)
    later = [Call.rollout_id == rollout_id]
    chosen: list[int] = []
    used = 0
    following = None
    while True:
        after_last = later + ([Call.seq > (chosen[-1] if chosen else after)] if chosen or after is not None else [])
        if len(chosen) == page:  # full by count: is there a call after it? (not measured: it is not sent)
            more = (await session.execute(select(Call.seq).where(*after_last).limit(1))).first()
            following = chosen[-1] if more is not None else None
            break
        # as many as the average so far says still fit, and one more to find the end (or the next page)
        fit = (max_bytes - used) // max(1, used // len(chosen)) + 1 if chosen else FIRST_CHUNK
        want = max(1, min(fit, MAX_CHUNK, page - len(chosen)))
        rows = list((await session.execute(
            select(Call.seq, size).where(*after_last).order_by(Call.seq).limit(want))).all())
        for seq, bytes_ in rows:
            if chosen and used + bytes_ > max_bytes:
                following = chosen[-1]
                break
            chosen.append(seq)
            used += bytes_
        if following is not None or len(rows) < want:  # full by size, or the rollout's last call is in
            break
    if not chosen:
        return [], None
    calls = list((await session.execute(
        select(Call).where(Call.rollout_id == rollout_id, Call.seq >= chosen[0], Call.seq <= chosen[-1])
        .order_by(Call.seq))).scalars())
    return calls, following


async def calls_summary(session: AsyncSession, rollout_id: str) -> dict[str, Any]:
    """What a rollout's calls came to, without reading one of them (`GET /rollouts/{id}?calls=false`: what
    `rlproxy run` needs at each attempt's end, on `--resume` and while pacing): how many, the versions that
    answered them (in the order each first did, with the seq of its first and last call) and how many ended in
    each status and HTTP status. Two grouped scans of the rollout's index, whatever its calls hold."""
    of_rollout = Call.rollout_id == rollout_id
    policies = (await session.execute(
        select(Call.policy_version, func.count(), func.min(Call.seq), func.max(Call.seq)).where(of_rollout)
        .group_by(Call.policy_version).order_by(func.min(Call.seq)))).all()
    statuses = (await session.execute(
        select(Call.status, Call.http_status, func.count()).where(of_rollout)
        .group_by(Call.status, Call.http_status).order_by(Call.status, Call.http_status))).all()
    return {
        "call_count": sum(count for _, count, _, _ in policies),
        "policies": [{"policy": version, "calls": count, "first_seq": first, "last_seq": last}
                     for version, count, first, last in policies],
        "statuses": [{"status": status, "http_status": http, "calls": count} for status, http, count in statuses],
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
        "sampling_override": call.sampling_override,
        "request": call.request,
        "response": call.response,
        "error": call.error,
    }
