"""Read-only queries behind the web view (proxy/routes/ui.py): rollouts listed with filters and keyset pages, one
rollout's calls a page at a time, and the attempts of one task side by side.

Every query takes the caller's `project` (None: the operator, who sees all) and applies the same rule as
`GET /rollouts/{id}`: a key sees its own project's rollouts and those recorded with no project. Pages are keyset
pages (a cursor holding the last row's sort value and id), so the 1,000th page costs what the first does.
"""
from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from core.errors import RlproxyError
from store.models import Rollout
from store.rollout_view import get_rollout

# Sort orders: name -> (column expression, descending). Null rewards sort as the lowest reward.
LOWEST = -1e308
SORTS = ("newest", "oldest", "reward_high", "reward_low")
MAX_PAGE = 200
MAX_GROUP = 500


class BadQuery(RlproxyError, ValueError):
    """A filter or cursor of the web view's queries that cannot be used."""


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


def _visible(project: str | None):
    return True if project is None else or_(Rollout.project == project, Rollout.project.is_(None))


def _conditions(scope: str | None, f: RolloutFilter) -> list[Any]:
    conditions = [_visible(scope)]
    if f.project is not None:
        conditions.append(Rollout.project == f.project)
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


def _sort_key(sort: str):
    if sort in ("newest", "oldest"):
        return Rollout.created_at, sort == "newest"
    if sort in ("reward_high", "reward_low"):
        return func.coalesce(Rollout.reward, LOWEST), sort == "reward_high"
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


def _row(r: Rollout) -> dict[str, Any]:
    return {"rollout_id": r.id, "project": r.project, "task_id": r.task_id, "agent": r.agent, "status": r.status,
            "reward": r.reward, "policy": r.policy_version, "eval": r.eval, "calls": r.call_count,
            "trained": r.trained_at is not None,
            "created_at": r.created_at.isoformat() if r.created_at else None,
            "finished_at": r.finished_at.isoformat() if r.finished_at else None}


async def list_rollouts(session: AsyncSession, scope: str | None, f: RolloutFilter, *, sort: str = "newest",
                        limit: int = 50, cursor: str | None = None) -> dict[str, Any]:
    """One page of rollouts, the cursor of the next (None at the end), and how many match in all."""
    key, descending = _sort_key(sort)
    limit = max(1, min(limit, MAX_PAGE))
    conditions = _conditions(scope, f)
    total = (await session.execute(select(func.count()).select_from(Rollout).where(*conditions))).scalar_one()
    if cursor:
        value, after_id = decode_cursor(cursor)
        if isinstance(value, datetime) != (sort in ("newest", "oldest")):
            raise BadQuery("cursor belongs to another sort order")
        beyond = (key < value) if descending else (key > value)
        same = (Rollout.id < after_id) if descending else (Rollout.id > after_id)
        conditions.append(or_(beyond, and_(key == value, same)))
    order = (key.desc(), Rollout.id.desc()) if descending else (key.asc(), Rollout.id.asc())
    rows = list((await session.execute(
        select(Rollout, key).where(*conditions).order_by(*order).limit(limit + 1))).all())
    more = len(rows) > limit
    rows = rows[:limit]
    following = encode_cursor(rows[-1][1], rows[-1][0].id) if more and rows else None
    return {"data": [_row(r) for r, _ in rows], "next": following, "total": total}


async def visible_rollout(session: AsyncSession, scope: str | None, rollout_id: str) -> Rollout | None:
    rollout = await session.get(Rollout, rollout_id)
    if rollout is None or (scope is not None and rollout.project not in (None, scope)):
        return None
    return rollout


async def rollout_page(session: AsyncSession, scope: str | None, rollout_id: str, *, after: int = -1,
                       limit: int = 50) -> dict[str, Any] | None:
    """The rollout's summary and one page of its calls (seq > `after`) with their rewards and the rollout's own
    (store/rollout_view.py, as `GET /rollouts/{id}` pages them); None if the caller may not see it."""
    rollout = await visible_rollout(session, scope, rollout_id)
    if rollout is None:
        return None
    page = await get_rollout(session, rollout_id, project=scope, limit=max(1, min(limit, MAX_PAGE)), after=after)
    return {"rollout": _row(rollout) | {"metadata": page["metadata"]}, "rewards": page["rewards"],
            "calls": page["calls"], "next": page["next"]}


async def task_group(session: AsyncSession, scope: str | None, task_id: str) -> list[dict[str, Any]]:
    """The attempts of one task (oldest first, at most MAX_GROUP), as rows of the rollout list."""
    rows = (await session.execute(
        select(Rollout).where(_visible(scope), Rollout.task_id == task_id)
        .order_by(Rollout.created_at, Rollout.id).limit(MAX_GROUP))).scalars()
    return [_row(r) for r in rows]
