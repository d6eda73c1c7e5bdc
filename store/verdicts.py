"""Policy verdicts: what the gates and `rlproxy eval` measured and decided about a version, one typed row each
(store/models/policies.py PolicyVerdict), the only writer of them.

Kinds:

    canary        a canary's start (its fraction and scope; no decision yet) and its end (promoted or retired
                  on its mean reward against the active version's), store/canary.py
    command_gate  the command gate's score of a candidate and its verdict, or of a parent it measured
    command_eval  `rlproxy eval --command`'s score, by split
    heldout       `rlproxy eval`'s held-out success on the demo task family

Rows are only added: the newest of a kind (for `command_eval`, of a kind and split) is the current one, so a
writer never reads a record to change it, and earlier verdicts stay. `GET /policies` still shows a version's
verdicts as its `evaluation` object, assembled here (`as_evaluation`) in the shape it has always had.
"""
from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import select, union_all
from sqlalchemy.ext.asyncio import AsyncSession

from store.models import PolicyVerdict, as_utc

CANARY, COMMAND_GATE, COMMAND_EVAL, HELDOUT = "canary", "command_gate", "command_eval", "heldout"
KINDS = (CANARY, COMMAND_GATE, COMMAND_EVAL, HELDOUT)


async def add(session: AsyncSession, version: int, kind: str, *, split: str | None = None,
              measured: str | None = None, score: float | None = None, parent_version: int | None = None,
              parent_score: float | None = None, promoted: bool | None = None,
              evidence: dict[str, Any] | None = None, created_at: datetime | None = None) -> PolicyVerdict:
    """Record one verdict on `version` (a version with a row: the base model has none)."""
    if kind not in KINDS:
        raise ValueError(f"a verdict's kind is one of {', '.join(KINDS)}, not {kind!r}")
    row = PolicyVerdict(version=version, kind=kind, split=split, measured=measured, score=score,
                        parent_version=parent_version, parent_score=parent_score, promoted=promoted,
                        evidence=evidence or None, **({"created_at": created_at} if created_at else {}))
    session.add(row)
    await session.flush()
    return row


async def newest(session: AsyncSession, versions: Iterable[int], kind: str) -> dict[int, PolicyVerdict]:
    """The newest verdict of `kind` on each of `versions` that has one."""
    versions = list(versions)
    if not versions:
        return {}
    rows = (await session.execute(
        select(PolicyVerdict).where(PolicyVerdict.version.in_(versions), PolicyVerdict.kind == kind)
        .order_by(PolicyVerdict.id))).scalars()
    return {row.version: row for row in rows}


async def record(session: AsyncSession, version: int, kind: str) -> dict[str, Any] | None:
    """The newest verdict of `kind` on `version`, as its `evaluation` record (None: there is none)."""
    row = (await newest(session, [version], kind)).get(version)
    return None if row is None else as_record(row)


async def parent_score(session: AsyncSession, version: int, measured: str) -> float | None:
    """The newest kept command-gate score of `version` on what `measured` names (the command and split): its
    own, or the parent score a gate kept on one of its children (the only place for the base model's, which has
    no row). None: never measured so, and the gate must run it."""
    own = (select(PolicyVerdict.id.label("id"), PolicyVerdict.score.label("score"))
           .where(PolicyVerdict.version == version, PolicyVerdict.kind == COMMAND_GATE,
                  PolicyVerdict.measured == measured, PolicyVerdict.score.is_not(None)))
    kept = (select(PolicyVerdict.id.label("id"), PolicyVerdict.parent_score.label("score"))
            .where(PolicyVerdict.parent_version == version, PolicyVerdict.kind == COMMAND_GATE,
                   PolicyVerdict.measured == measured, PolicyVerdict.parent_score.is_not(None)))
    either = union_all(own, kept).subquery()
    return (await session.execute(
        select(either.c.score).order_by(either.c.id.desc()).limit(1))).scalar()


async def evaluations(session: AsyncSession, versions: Iterable[int]) -> dict[int, dict[str, Any]]:
    """Each of `versions` that has verdicts → its `evaluation` object (`as_evaluation`)."""
    versions = list(versions)
    if not versions:
        return {}
    rows: dict[int, list[PolicyVerdict]] = {}
    for row in (await session.execute(select(PolicyVerdict).where(PolicyVerdict.version.in_(versions))
                                      .order_by(PolicyVerdict.id))).scalars():
        rows.setdefault(row.version, []).append(row)
    return {version: as_evaluation(kept) for version, kept in rows.items()}


def as_evaluation(rows: Iterable[Any]) -> dict[str, Any]:
    """Verdict rows of one version, oldest first, as the `evaluation` object `GET /policies` has always shown:
    `canary` and `command_gate` records, `command_eval` by split, and the held-out result's `heldout_*` fields
    at the top. Only the newest of each kind (and split) shows."""
    current = {(row.kind, row.split if row.kind == COMMAND_EVAL else None): row for row in rows}
    shown: dict[str, Any] = {}
    for (kind, split), row in current.items():
        if kind == HELDOUT:
            shown.update(as_record(row))
        elif kind == COMMAND_EVAL:
            shown.setdefault(COMMAND_EVAL, {})[split] = as_record(row)
        else:
            shown[kind] = as_record(row)
    return shown


def as_record(row: Any) -> dict[str, Any]:
    """One verdict row as the record its kind has always had in `evaluation` (the typed columns under the
    names that record gives them, the evidence as it was written)."""
    evidence = dict(row.evidence or {})
    when = _iso(row.created_at)
    if row.kind == CANARY:
        decided = {} if row.promoted is None else {
            "mean_reward": row.score, "active_mean_reward": row.parent_score, "promoted": row.promoted}
        return {**evidence, "parent": row.parent_version, **decided}
    if row.kind == COMMAND_GATE:
        decided = {} if row.promoted is None else {
            "parent": row.parent_version, "parent_score": row.parent_score, "promoted": row.promoted}
        return {**evidence, "split": row.split, "digest": row.measured, "score": row.score, "when": when, **decided}
    if row.kind == COMMAND_EVAL:
        return {**evidence, "score": row.score, "digest": row.measured, "when": when}
    return {**evidence, "heldout_success": row.score, "heldout_task_set": row.measured, "when": when}


def _iso(moment: datetime | str | None) -> str | None:
    if isinstance(moment, str):  # as a raw SQLite read returns it
        moment = datetime.fromisoformat(moment)
    if moment is None:
        return None
    return as_utc(moment).isoformat()
