"""Writing captured calls: one transaction per batch, idempotent by call id, with sequence numbers and
prefix links assigned inside the transaction so several proxies can share one database."""
from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy import case, func, select, text, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession

from core.policy_rules import DEFAULT_POLICY
from store.dialect import database_now, insert_ignoring_duplicates
from store.id_arrays import id_array_param, id_array_text
from store.models import Call, CallChoice, PrefixKind, PrunedRollout, Rollout, as_utc
from store.records import CallRecord


CHOICE_ROWS_PER_STATEMENT = 500


@dataclass(slots=True)
class Parent:
    """The previous call of the same rollout and agent, as far as prefix linking needs it."""

    id: str
    prompt_ids: list[int] | None
    completion_ids: list[int] | None
    request: dict | None
    response: dict | None
    route: str = "chat"  # the wire format its request and response are in


@dataclass(slots=True)
class WrittenCall:
    """What the writer learns about a stored call (for metrics and automatic rewards)."""

    record: CallRecord
    seq: int | None
    prefix_kind: str | None
    parent: Parent | None
    late: bool = False  # its rollout had been trained already: a step took the trajectory without this call


def classify_prefix(prompt_ids: list[int] | None, parent: Parent | None) -> str | None:
    """How `prompt_ids` continue the parent call: see `PrefixKind`. None when ids are missing."""
    if parent is None:
        return PrefixKind.FIRST
    if prompt_ids is None or parent.prompt_ids is None:
        return None
    head = parent.prompt_ids
    if prompt_ids[: len(head)] != head:
        return PrefixKind.DIVERGED
    tail = parent.completion_ids or []
    if prompt_ids[len(head) : len(head) + len(tail)] == tail:
        return PrefixKind.EXTENDS
    return PrefixKind.RETOKENIZED


async def _latest_call(session: AsyncSession, rollout_id: str, agent: str | None) -> Parent | None:
    agent_filter = Call.agent.is_(None) if agent is None else Call.agent == agent
    row = (
        await session.execute(
            select(Call.id, Call.prompt_token_ids, CallChoice.token_ids, Call.request, Call.response, Call.route)
            .outerjoin(CallChoice, (CallChoice.call_id == Call.id) & (CallChoice.index == 0))
            .where(Call.rollout_id == rollout_id, agent_filter)
            .order_by(Call.seq.desc())
            .limit(1)
        )
    ).first()
    return Parent(*row) if row else None


async def write_calls(session: AsyncSession, records: list[CallRecord], *, may_repeat: bool = True,
                      pruned: list[CallRecord] | None = None,
                      foreign: list[CallRecord] | None = None) -> list[WrittenCall]:
    """Store `records` in the session's transaction. Replayed records (same id) are skipped, within the batch
    too; a caller that knows none was stored before (the writer's first attempt) passes `may_repeat=False` to
    save the look-up. Calls of a rollout retention has pruned are not stored (they would bring it back as an
    open rollout numbered from 1 again): they are added to `pruned`, for the caller to set aside. A project's
    call into a rollout another project owns is not stored either (added to `foreign`): the id was pruned and
    opened again by the other project while a proxy still held the first owner (proxy/edge/auth.py), and the call
    would train with the other project's reward."""
    # One id twice in a batch (a spool holding a call twice: written again by a stop that cut a replay short)
    # would be numbered twice and inserted once: a gap in the rollout's seq and a call_count one too high.
    seen: set[str] = set()
    fresh = records = [r for r in records if not (r.id in seen or seen.add(r.id))]  # the first of each id
    if may_repeat:
        ids = [r.id for r in records]
        known = set((await session.execute(select(Call.id).where(Call.id.in_(ids)))).scalars())
        fresh = [r for r in records if r.id not in known]
    # A call that waited in a spool while the operator pruned its rollout comes too late: one indexed look-up
    # per batch (a tombstone store/retention.py leaves for each rollout it deletes). Only a call made before the
    # prune: an agent may open a new rollout under the same id afterwards, and its calls were acknowledged too.
    rollout_ids = {r.rollout_id for r in fresh if r.rollout_id is not None}
    if rollout_ids:
        gone = {rid: as_utc(at) for rid, at in (await session.execute(
            select(PrunedRollout.id, PrunedRollout.pruned_at).where(PrunedRollout.id.in_(rollout_ids)))).all()}
        late = [r for r in fresh if r.rollout_id in gone and as_utc(r.started_at) < gone[r.rollout_id]]
        if late:
            if pruned is not None:
                pruned.extend(late)
            fresh = [r for r in fresh if r not in late]
    if not fresh:
        return []

    by_rollout: dict[str, list[CallRecord]] = defaultdict(list)
    for record in fresh:
        if record.rollout_id is not None:
            by_rollout[record.rollout_id].append(record)

    if by_rollout:
        # created now by the database's clock, not the first call's (a proxy's): the reward TTL and retention
        # compare it with their own `now`, which is the database's too (store/dialect.py)
        created_at = await database_now(session)
        await session.execute(
            insert_ignoring_duplicates(session, Rollout.__table__, ["id"]),
            [
                {"id": rid, "task_id": calls[0].task_id, "agent": calls[0].agent, "project": calls[0].project,
                 "status": "open", "call_count": 0, "created_at": created_at,
                 "policy_version": calls[0].policy_version}  # the version that answered its first call
                for rid, calls in by_rollout.items()
            ],
        )

    if by_rollout:
        stray = await _calls_of_other_projects(session, by_rollout)
        if stray:
            if foreign is not None:
                foreign.extend(stray)
            stray_ids = {r.id for r in stray}
            fresh = [r for r in fresh if r.id not in stray_ids]
            for rid in list(by_rollout):
                by_rollout[rid] = [r for r in by_rollout[rid] if r.id not in stray_ids]
                if not by_rollout[rid]:
                    del by_rollout[rid]
            if not fresh:
                return []

    seqs: dict[str, int] = {}
    late: set[str] = set()
    for rid, calls in sorted(by_rollout.items()):  # a fixed lock order avoids deadlocks between proxies
        calls.sort(key=lambda r: r.started_at)
        values = {"call_count": Rollout.call_count + len(calls)}
        if any(c.eval for c in calls):  # `X-Rlproxy-Eval` on any call marks the rollout (never unmarks it)
            values["eval"] = True
        if calls[0].policy_version is not None:
            # The version that answered its first call; POST /rollouts only predicted it (a policy refresh or an
            # X-Rlproxy-Eval header on the call can send it elsewhere). SET reads the row as it was.
            values["policy_version"] = case(
                (Rollout.call_count == 0, calls[0].policy_version),
                else_=func.coalesce(Rollout.policy_version, calls[0].policy_version))
        end, trained_at = (
            await session.execute(
                update(Rollout).where(Rollout.id == rid).values(**values)
                .returning(Rollout.call_count, Rollout.trained_at)
            )
        ).one()
        if trained_at is not None:
            late.update(record.id for record in calls)
        for offset, record in enumerate(calls):
            seqs[record.id] = end - len(calls) + offset + 1

    parents: dict[tuple[str, str | None], Parent | None] = {}
    written: list[WrittenCall] = []
    call_rows, choice_rows = [], []
    for record in sorted(fresh, key=lambda r: (seqs.get(r.id, 0), r.started_at)):
        parent, kind = None, None
        if record.rollout_id is not None:
            key = (record.rollout_id, record.agent)
            if key not in parents:
                parents[key] = await _latest_call(session, *key)
            parent = parents[key]
            kind = classify_prefix(record.prompt_token_ids, parent)
            first = record.choices[0] if record.choices else None
            parents[key] = Parent(record.id, record.prompt_token_ids, first.token_ids if first else None,
                                  record.request, record.response, record.route)
        call_rows.append(_call_row(record, seqs.get(record.id), parent, kind))
        choice_rows.extend(
            {"call_id": record.id, "index": c.index, "token_ids": c.token_ids, "logprobs": c.logprobs,
             "finish_reason": _storable(c.finish_reason, CallChoice.finish_reason)}
            for c in record.choices
        )
        written.append(WrittenCall(record, seqs.get(record.id), kind, parent, late=record.id in late))

    insert_calls = insert_ignoring_duplicates(session, Call.__table__, ["id"])
    if session.get_bind().dialect.name == "postgresql":  # ids as the array's text, cast there (store/id_arrays.py)
        insert_calls = insert_calls.values(prompt_token_ids=id_array_param("prompt_token_ids"))
        for row in call_rows:
            row["prompt_token_ids"] = id_array_text(row["prompt_token_ids"])
    await session.execute(insert_calls, call_rows)
    # Choices in chunks, the event loop free between them: the driver prepares each row's parameters in Python,
    # and one call of 20,000 choices held every other request of the proxy for half a second in one statement.
    insert_choices = insert_ignoring_duplicates(session, CallChoice.__table__, ["call_id", "index"])
    if session.get_bind().dialect.name == "postgresql":
        insert_choices = insert_choices.values(token_ids=id_array_param("token_ids"))
        for row in choice_rows:
            row["token_ids"] = id_array_text(row["token_ids"])
    for start in range(0, len(choice_rows), CHOICE_ROWS_PER_STATEMENT):
        if start:
            await asyncio.sleep(0)
        await session.execute(insert_choices,
                              choice_rows[start:start + CHOICE_ROWS_PER_STATEMENT])
    return written


async def _calls_of_other_projects(session: AsyncSession,
                                   by_rollout: dict[str, list[CallRecord]]) -> list[CallRecord]:
    """The calls of a project whose rollout (its row exists by now) belongs to another project. The operator's
    calls (no project) go anywhere, as its key may; a project's call into a rollout of no project is refused by
    the proxy before it is made (proxy/edge/auth.py)."""
    owners = dict((await session.execute(
        select(Rollout.id, Rollout.project).where(Rollout.id.in_(list(by_rollout))))).all())
    return [record for rid, calls in by_rollout.items() for record in calls
            if record.project is not None and owners.get(rid) is not None and owners[rid] != record.project]


def _call_row(record: CallRecord, seq: int | None, parent: Parent | None, kind: str | None) -> dict:
    return {
        "id": record.id,
        "rollout_id": record.rollout_id,
        "seq": seq,
        "agent": record.agent,
        "task_id": record.task_id,
        "project": record.project,
        "route": record.route,
        "model": _storable(record.model, Call.model),
        "upstream_model": _storable(record.upstream_model, Call.upstream_model),
        "policy_version": record.policy_version,
        # A record with a version but no policy name (spooled by a proxy before named policies) is the default's.
        "policy": record.policy or (DEFAULT_POLICY if record.policy_version is not None else None),
        "stream": record.stream,
        "status": record.status,
        "http_status": record.http_status,
        "upstream": _storable(record.upstream, Call.upstream),
        "request": record.request,
        "response": record.response,
        "error": _storable(record.error, Call.error),
        "prompt_token_ids": record.prompt_token_ids,
        "prompt_tokens": len(record.prompt_token_ids) if record.prompt_token_ids is not None else None,
        "completion_tokens": record.completion_tokens,
        "prefix_parent_id": parent.id if parent is not None and kind != PrefixKind.FIRST else None,
        "prefix_kind": kind,
        "latency_ms": record.latency_ms,
        "ttft_ms": record.ttft_ms,
        "sampling": record.sampling[:64] if record.sampling else None,
        "logprobs_mode": record.logprobs_mode,
        "sampling_override": record.sampling_override,
        "started_at": record.started_at,
        "finished_at": record.finished_at,
    }


def _storable(text: str | None, column) -> str | None:
    """A descriptive text as its column holds it. What the agent or the engine named (a model name it asked for,
    an engine's finish reason or error message) is answered before it is stored: a NUL in it or a name longer
    than the column would make the database refuse the whole call after the agent had its answer. So NUL
    becomes U+FFFD (Postgres text cannot hold it) and the text is cut at the column's size. Ids are not
    touched here: the request's edge refuses the ones no column holds (core/ids.py)."""
    if text is None:
        return None
    text = text.replace("\x00", "\ufffd")
    limit = _length(column)
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


_LENGTHS: dict[int, int | None] = {}  # id of a mapped column -> its length (the columns live as long as the module)


def _length(column) -> int | None:
    """A column's length, read once: `Call.model.type` goes through SQLAlchemy's attribute proxies, 17 us each
    time on a loaded 2-core machine, and every stored call read it five times."""
    key = id(column)
    if key not in _LENGTHS:
        _LENGTHS[key] = getattr(column.type, "length", None)
    return _LENGTHS[key]


async def database_identity(session: AsyncSession) -> str | None:
    """What tells this database from every other one and stays the same across its restarts (the spool is
    replayed only into the database it was written for): Postgres' cluster `system_identifier` and the
    database's name; for SQLite the file's absolute path. None where it cannot be read (a server that does not
    grant `pg_control_system()`: the spool then goes by the database's address)."""
    if session.get_bind().dialect.name == "postgresql":
        try:
            async with session.begin_nested():
                row = (await session.execute(text(
                    "SELECT system_identifier, current_database() FROM pg_control_system()"))).one()
        except DBAPIError as exc:
            if not str(getattr(exc.orig, "sqlstate", "") or "").startswith("42"):
                raise  # the database did not answer: the caller tries again later
            return None  # not granted here (42501): the caller falls back on the address
        return f"postgresql:{row[0]}/{row[1]}"
    for _, name, file in (await session.execute(text("PRAGMA database_list"))).all():
        if name == "main":
            return f"sqlite:{file}" if file else None  # an in-memory database has no identity to keep
    return None


@dataclass(slots=True)
class StoredCall:
    """A recorded call as a later request refers to it (Responses' `previous_response_id`, `GET /v1/responses`)."""

    id: str
    route: str
    status: str
    request: dict | None
    response: dict | None


async def get_call(session: AsyncSession, call_id: str, *, project: str | None = None,
                   rollout_id: str | None = None) -> StoredCall | None:
    """The call with this id, or None; with `project`, only that project's calls are visible, with `rollout_id`
    only that rollout's (a rollout token's request)."""
    query = select(Call.id, Call.route, Call.status, Call.request, Call.response).where(Call.id == call_id)
    if project is not None:
        query = query.where(Call.project == project)
    if rollout_id is not None:
        query = query.where(Call.rollout_id == rollout_id)
    row = (await session.execute(query)).first()
    return StoredCall(*row) if row else None


async def rollout_call_times(session: AsyncSession, rollout_id: str):
    """The rollout's calls in order, each with `id`, `seq`, `started_at` and `policy_version` (what a span's
    reward needs to find the call it is for)."""
    return (await session.execute(
        select(Call.id, Call.seq, Call.started_at, Call.policy_version)
        .where(Call.rollout_id == rollout_id).order_by(Call.seq))).all()


async def call_responses_newest_first(session: AsyncSession, rollout_id: str, *, below_seq: int | None, limit: int):
    """Up to `limit` of the rollout's calls with a seq below `below_seq` (None: any), newest first, each with `id`,
    `seq`, `route` and `response`: read a page at a time, so a rollout of thousands is never loaded whole."""
    query = (select(Call.id, Call.seq, Call.route, Call.response).where(Call.rollout_id == rollout_id)
             .order_by(Call.seq.desc()).limit(limit))
    if below_seq is not None:
        query = query.where(Call.seq < below_seq)
    return (await session.execute(query)).all()


async def completion_responses(session: AsyncSession, rollout_ids: list[str]) -> list[tuple[str, str, dict | None]]:
    """(call id, route, response) of every call of these rollouts."""
    return [tuple(row) for row in await session.execute(
        select(Call.id, Call.route, Call.response).where(Call.rollout_id.in_(rollout_ids)))]
