"""Read-only queries behind the web view (proxy/routes/ui.py): rollouts listed with filters and keyset pages, one
rollout's calls a page at a time, and the attempts of one task side by side.

Every query takes the caller's `project` (None: the operator, who sees all) and applies the same rule as
`GET /rollouts/{id}`: a key sees its own project's rollouts and those recorded with no project. Pages are keyset
pages (a cursor holding the last row's sort value and id), so the 1,000th page costs what the first does.

These routes are open to every project key and share the proxy's connection pool with the recording path, so each
query is shaped to be served by an index of migration 0011 (listed with `ORDERINGS`) and read with a time limit:
- a list page reads `(sort key, id)` in index order from the cursor on and stops after `limit + 1` rows. A project
  key sees two projects (its own and none), which no single index range holds in order; the page is therefore two
  index ranges (`project = KEY`, `project IS NULL`), each limited, merged by the database;
- the total is counted on the first page only, and only up to `TOTAL_CAP` (`total_exact` false past it): an exact
  count of millions of rows is a scan of them all, every 3 s while a tab is in Live mode;
- every statement runs under `QUERY_TIMEOUT_MS` (Postgres), so a filter no index serves (a rare agent over millions of
  rows) ends with an error instead of holding a pooled connection for minutes.
"""
from __future__ import annotations

import base64
import binascii
import functools
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Float, cast, func, literal_column, or_, select, text, tuple_, union_all
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession

from core.checks import reward_problem
from core.errors import RlproxyError
from rewards.advantages import grpo
from store.models import Call, Rollout, RolloutStatus
from store.rollout_view import PAGE_BYTES, get_rollout

# Null rewards sort as the lowest reward. Written into the SQL as a literal, not a parameter, and spelled as the index
# of migration 0011 spells it: a planner uses an expression index only for the same expression (SQLite: the same
# text), and that spelling is also the one Postgres gives back, so the migration and the models compare equal.
LOWEST = -1e308
REWARD_KEY = func.coalesce(Rollout.reward, cast(literal_column("'-1e+308'"), Float))
SORTS = ("newest", "oldest", "reward_high", "reward_low")
MAX_PAGE = 200
MAX_GROUP = 500
TOTAL_CAP = 10_000
QUERY_TIMEOUT_MS = 5_000
QUERY_CANCELED = "57014"  # Postgres' SQLSTATE for a statement ended by statement_timeout

# Which index serves which list query (migration 0011; tests/test_browse_queries.py checks the planner uses them).
ORDERINGS = {
    ("newest", False): "ix_rollouts_created", ("oldest", False): "ix_rollouts_created",
    ("reward_high", False): "ix_rollouts_reward", ("reward_low", False): "ix_rollouts_reward",
    ("newest", True): "ix_rollouts_project_created", ("oldest", True): "ix_rollouts_project_created",
    ("reward_high", True): "ix_rollouts_project_reward", ("reward_low", True): "ix_rollouts_project_reward",
}

# The columns a row of the list shows: not `metadata` (up to a rollout body each, never shown in the list).
LISTED = (Rollout.id, Rollout.project, Rollout.task_id, Rollout.agent, Rollout.status, Rollout.reward,
          Rollout.policy_version, Rollout.eval, Rollout.call_count, Rollout.trained_at, Rollout.created_at,
          Rollout.finished_at)


class BadQuery(RlproxyError, ValueError):
    """A filter or cursor of the web view's queries that cannot be used."""


class TooSlow(BadQuery):
    """A query of the web view ran past QUERY_TIMEOUT_MS (its filters are served by no index)."""


@dataclass(frozen=True)
class RolloutFilter:
    project: str | None = None  # the operator's choice of one project (keys are scoped before this)
    agent: str | None = None
    task_id: str | None = None
    status: str | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    policy_version: int | None = None
    since: datetime | None = None
    until: datetime | None = None
    eval: bool | None = None


@dataclass(frozen=True)
class ListQuery:
    """A list query checked before anything is asked of the database (or of the writer)."""

    sort: str
    limit: int
    cursor: tuple[Any, str] | None


def check_list_query(sort: str, limit: int, cursor: str | None) -> ListQuery:
    """The sort and the cursor, checked: raises BadQuery. Cheap, so the route does it before any waiting."""
    if sort not in SORTS:
        raise BadQuery(f"unknown sort {sort!r}; one of {', '.join(SORTS)}")
    after = decode_cursor(cursor) if cursor else None
    if after is not None and isinstance(after[0], datetime) != (sort in ("newest", "oldest")):
        raise BadQuery("cursor belongs to another sort order")
    return ListQuery(sort, max(1, min(limit, MAX_PAGE)), after)


async def time_limited(session: AsyncSession) -> None:
    """Bound every statement of this session's transaction (Postgres; SQLite is one process's own file)."""
    if session.get_bind().dialect.name == "postgresql":
        await session.execute(text(f"SET LOCAL statement_timeout = {QUERY_TIMEOUT_MS}"))


def _time_limited_query(function):
    """Run `function` (a query of this module) with TooSlow for a statement ended by `time_limited`'s bound."""
    @functools.wraps(function)
    async def bounded(*args, **kwargs):
        try:
            return await function(*args, **kwargs)
        except DBAPIError as exc:
            state = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
            if str(state or "") != QUERY_CANCELED:
                raise
            raise TooSlow(f"the query ran past {QUERY_TIMEOUT_MS // 1000} s: narrow it (a project, task, agent or "
                          "time range)") from None
    return bounded


def _projects(scope: str | None, chosen: str | None) -> list[Any] | None:
    """The project conditions whose rows together are what the caller may see and chose: each one index range of
    the project indexes. None: no project condition (the operator, all projects); []: nothing to see."""
    if scope is None:
        return None if chosen is None else [Rollout.project == chosen]
    if chosen is None:
        return [Rollout.project == scope, Rollout.project.is_(None)]
    return [Rollout.project == chosen] if chosen == scope else []


def _conditions(f: RolloutFilter) -> list[Any]:
    conditions = []
    for column, value in ((Rollout.agent, f.agent), (Rollout.task_id, f.task_id), (Rollout.status, f.status),
                          (Rollout.policy_version, f.policy_version), (Rollout.eval, f.eval)):
        if value is not None:
            conditions.append(column == value)
    if f.reward_min is not None:
        conditions.append(Rollout.reward >= f.reward_min)
    if f.reward_max is not None:
        conditions.append(Rollout.reward <= f.reward_max)
    if f.since is not None:
        conditions.append(Rollout.created_at >= f.since)
    if f.until is not None:
        conditions.append(Rollout.created_at < f.until)
    return conditions


def _visible(scope: str | None):
    return True if scope is None else or_(Rollout.project == scope, Rollout.project.is_(None))


def _sort_key(sort: str):
    if sort in ("newest", "oldest"):
        return Rollout.created_at, sort == "newest"
    if sort in ("reward_high", "reward_low"):
        return REWARD_KEY, sort == "reward_high"
    raise BadQuery(f"unknown sort {sort!r}; one of {', '.join(SORTS)}")


def encode_cursor(value: Any, rollout_id: str) -> str:
    if isinstance(value, datetime):
        value = {"t": value.isoformat()}
    return base64.urlsafe_b64encode(json.dumps([value, rollout_id]).encode()).decode()


def decode_cursor(cursor: str) -> tuple[Any, str]:
    try:
        value, rollout_id = json.loads(base64.urlsafe_b64decode(cursor.encode()))
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise BadQuery("cursor is not one this server gave out") from None
    if isinstance(value, dict) and isinstance(value.get("t"), str):
        try:
            value = datetime.fromisoformat(value["t"])
            value = value.astimezone(timezone.utc) if value.tzinfo else value.replace(tzinfo=timezone.utc)
        except (ValueError, OverflowError):  # not a time, or one at the calendar's ends with no UTC time
            raise BadQuery("cursor is not one this server gave out") from None
    if not isinstance(rollout_id, str) or not isinstance(value, (int, float, datetime)) or isinstance(value, bool):
        raise BadQuery("cursor is not one this server gave out")
    if isinstance(value, int):  # a reward: the column is a float, and the driver takes no larger int
        value = float(value) if abs(value) < 2 ** 53 else math.inf
    # what no stored row holds, and the database would refuse as a parameter: a NUL, an id past the column's size
    if isinstance(value, float) and not math.isfinite(value) or "\x00" in rollout_id or len(rollout_id) > 128:
        raise BadQuery("cursor is not one this server gave out")
    return value, rollout_id


def _row(r: Any) -> dict[str, Any]:
    return {"rollout_id": r.id, "project": r.project, "task_id": r.task_id, "agent": r.agent, "status": r.status,
            "reward": r.reward, "policy": r.policy_version, "eval": r.eval, "calls": r.call_count,
            "trained": r.trained_at is not None,
            "created_at": r.created_at.isoformat() if r.created_at else None,
            "finished_at": r.finished_at.isoformat() if r.finished_at else None}


def list_statements(scope: str | None, f: RolloutFilter, query: ListQuery):
    """The page's statement and the capped count's (None past the first page, or when nothing can match)."""
    key, descending = _sort_key(query.sort)
    projects = _projects(scope, f.project)
    if projects == []:
        return None, None
    conditions = _conditions(f)
    if query.cursor is not None:
        # one row comparison, not an OR of two: the index range starts at the cursor instead of being filtered
        value, after_id = query.cursor
        beyond = tuple_(key, Rollout.id) < tuple_(value, after_id) if descending else \
            tuple_(key, Rollout.id) > tuple_(value, after_id)
        conditions.append(beyond)
    order = (key.desc(), Rollout.id.desc()) if descending else (key.asc(), Rollout.id.asc())
    ranges = [conditions] if projects is None else [conditions + [p] for p in projects]
    branches = [select(*LISTED, key.label("sort_key")).where(*c).order_by(*order).limit(query.limit + 1)
                for c in ranges]
    if len(branches) == 1:
        page = branches[0]
    else:  # each range in its index order, limited; the merge sorts at most 2 × (limit + 1) rows
        merged = union_all(*(select(b.subquery()) for b in branches)).subquery()
        page = select(merged).order_by(*((merged.c.sort_key.desc(), merged.c.id.desc()) if descending else
                                         (merged.c.sort_key.asc(), merged.c.id.asc()))).limit(query.limit + 1)
    counted = None
    if query.cursor is None:
        capped = [select(Rollout.id).where(*c).limit(TOTAL_CAP + 1).subquery() for c in ranges]
        counted = [select(func.count()).select_from(c) for c in capped]
    return page, counted


@_time_limited_query
async def list_rollouts(session: AsyncSession, scope: str | None, f: RolloutFilter, query: ListQuery | None = None,
                        *, sort: str = "newest", limit: int = 50, cursor: str | None = None) -> dict[str, Any]:
    """One page of rollouts and the cursor of the next (None at the end); on the first page (no cursor) also how
    many match, counted up to TOTAL_CAP: `total_exact` is false when more match (`total` is then TOTAL_CAP).
    Past the first page `total` is None. `query` is the checked sort, limit and cursor (else these three)."""
    query = query or check_list_query(sort, limit, cursor)
    page, counted = list_statements(scope, f, query)
    if page is None:
        return {"data": [], "next": None, "total": 0 if query.cursor is None else None, "total_exact": True}
    await time_limited(session)
    rows = list((await session.execute(page)).all())
    more = len(rows) > query.limit
    rows = rows[:query.limit]
    following = encode_cursor(rows[-1].sort_key, rows[-1].id) if more and rows else None
    total, exact = None, None
    if counted is not None:
        total = sum([(await session.execute(c)).scalar_one() for c in counted])
        exact = total <= TOTAL_CAP
        total = min(total, TOTAL_CAP)
    return {"data": [_row(r) for r in rows], "next": following, "total": total, "total_exact": exact}


async def visible_rollout(session: AsyncSession, scope: str | None, rollout_id: str) -> Rollout | None:
    rollout = await session.get(Rollout, rollout_id)
    if rollout is None or (scope is not None and rollout.project not in (None, scope)):
        return None
    return rollout


@_time_limited_query
async def rollout_page(session: AsyncSession, scope: str | None, rollout_id: str, *, after: int = -1,
                       limit: int = 50) -> dict[str, Any] | None:
    """The rollout's summary and one page of its calls (seq > `after`) with their rewards and the rollout's own
    (store/rollout_view.py, as `GET /rollouts/{id}` pages them) and each call's `train_decision`; None if the
    caller may not see it.

    A page ends at `limit` calls or at about PAGE_BYTES of stored calls, whichever comes first (at least one call):
    recorded bodies are whatever the agents sent, megabytes each. The metadata and events come with the first page
    (`after` -1) only; later pages would repeat them."""
    await time_limited(session)
    rollout = await visible_rollout(session, scope, rollout_id)
    if rollout is None:
        return None
    first = after < 0
    page = await get_rollout(session, rollout_id, project=scope, limit=max(1, min(limit, MAX_PAGE)), after=after,
                             max_bytes=PAGE_BYTES, with_metadata=first)
    summary = _row(rollout) | ({"metadata": page["metadata"]} if first else {})
    decisions = dict((await session.execute(select(Call.id, Call.train_decision).where(
        Call.id.in_([c["call_id"] for c in page["calls"]])))).all()) if page["calls"] else {}
    for call in page["calls"]:  # what the trainer decided: "trained", a skip reason, or None (not yet trained)
        call["train_decision"] = decisions.get(call["call_id"])
    return {"rollout": summary, "rewards": page["rewards"], "calls": page["calls"], "next": page["next"]}


@_time_limited_query
async def task_group(session: AsyncSession, scope: str | None, task_id: str) -> dict[str, Any]:
    """The attempts of one task, newest first, at most MAX_GROUP (`truncated`: there are more), as rows of the
    rollout list. Each finished, rewarded attempt that is not evaluation traffic gets `advantage`: GRPO's
    (reward - mean) / (std + eps) within the listed attempts of its own project. Evaluation rollouts are never
    trained on, so they are left out of the group (and get no advantage); a task id names a task within its
    project, as the trainer groups (trainer/batch.py). This is the group as the list shows it, not one training
    step's batch: the trainer compares only the rollouts one step trains (docs/ui.md)."""
    await time_limited(session)
    rows = list((await session.execute(
        select(*LISTED).where(_visible(scope), Rollout.task_id == task_id)
        .order_by(Rollout.created_at.desc(), Rollout.id.desc()).limit(MAX_GROUP + 1))).all())
    attempts = [_row(r) for r in rows[:MAX_GROUP]]
    groups: dict[str | None, list[dict[str, Any]]] = {}
    for a in attempts:
        # a reward stored before rewards were bounded (infinite, huge) is no group member: the trainer skips it too
        if a["status"] == RolloutStatus.FINISHED and reward_problem(a["reward"]) is None and not a["eval"]:
            groups.setdefault(a["project"], []).append(a)
    for members in groups.values():
        for attempt, advantage in zip(members, grpo([a["reward"] for a in members])):
            attempt["advantage"] = advantage
    return {"data": attempts, "truncated": len(rows) > MAX_GROUP}

