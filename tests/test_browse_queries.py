"""The web view's list query (store/browse.py) on a table of some size: each ordering, for the operator and for a
project key, is read from an index of migration 0011 in index order (the planner's own choice after ANALYZE, on a
table of 20,000 rollouts across projects), the keyset pages walk every row once, the total is counted on the first
page only and only up to a cap, a refused filter costs the writer nothing, and a query past the time limit ends."""
from __future__ import annotations

import json
import random
import uuid
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from sqlalchemy import event, text

from proxy.errors import InvalidRequest
from proxy.routes import ui
from proxy.state import STATE
from store import browse
from store.db import open_database, session_factory
from store.models import Rollout

ROWS = 20_000
PROJECTS = [f"p{i}" for i in range(20)]
SORTS = list(browse.SORTS)


@pytest.fixture
async def big_table(own_database_url):
    """20,000 rollouts: 20 projects and some of none, times a second apart, rewards with gaps, analysed."""
    database = open_database(own_database_url)
    async with database.begin() as conn:
        await conn.execute(text("""
            INSERT INTO rollouts (id, project, task_id, agent, status, reward, eval, call_count, created_at)
            SELECT md5(i::text), CASE WHEN i % 21 = 0 THEN NULL ELSE 'p' || (i % 20) END, 't' || (i % 500),
                   'a' || (i % 7), CASE WHEN i % 3 = 0 THEN 'open' ELSE 'finished' END,
                   CASE WHEN i % 5 = 0 THEN NULL ELSE round((i % 97)::numeric / 97, 2)::float8 END, i % 11 = 0, 0,
                   timestamptz '2026-11-01 00:00:00+00' + (i / 3) * interval '1 second'
            FROM generate_series(1, :rows) AS i"""), {"rows": ROWS})
        await conn.execute(text("ANALYZE rollouts"))
    yield database
    await database.dispose()


@contextmanager
def capture(database):
    """The list statements the store sends (with their parameters), to EXPLAIN them as sent."""
    sent = []

    def before(conn, cursor, statement, parameters, context, executemany):
        if "ORDER BY" in statement:
            sent.append((statement, parameters))
    event.listen(database.sync_engine, "before_cursor_execute", before)
    try:
        yield sent
    finally:
        event.remove(database.sync_engine, "before_cursor_execute", before)


async def plan(database, statement: str, parameters) -> str:
    async with database.connect() as conn:
        rows = (await conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement, parameters)).all()
    return json.dumps(rows[0][0])


@pytest.mark.parametrize("sort", SORTS)
@pytest.mark.parametrize("who", ["operator", "operator, one project", "project key"])
async def test_each_ordering_of_the_list_is_an_index_scan(big_table, sort, who):
    scope, chosen = {"operator": (None, None), "operator, one project": (None, "p3"),
                     "project key": ("p3", None)}[who]
    sessions = session_factory(big_table)
    with capture(big_table) as sent:
        async with sessions() as session:
            first = await browse.list_rollouts(session, scope, browse.RolloutFilter(project=chosen), sort=sort,
                                               limit=50)
            await browse.list_rollouts(session, scope, browse.RolloutFilter(project=chosen), sort=sort, limit=50,
                                       cursor=first["next"])
    assert len(sent) == 2 and first["next"]
    index = browse.ORDERINGS[(sort, scope is not None or chosen is not None)]
    for statement, parameters in sent:  # the first page, and a page from a cursor
        shown = await plan(big_table, statement, parameters)
        assert index in shown and "Seq Scan" not in shown and "Bitmap" not in shown, shown
        # read in index order: nothing sorts the table; a project key's two ranges are each limited before a merge
        for node in nodes(json.loads(shown)[0]["Plan"]):
            if node["Node Type"] == "Sort":
                assert any(below["Node Type"] == "Limit" for below in nodes(node)[1:]), shown


def nodes(plan: dict) -> list[dict]:
    """A plan node and every node below it."""
    return [plan] + [node for child in plan.get("Plans", []) for node in nodes(child)]


@pytest.mark.parametrize("sort", SORTS)
async def test_the_keyset_pages_walk_every_visible_row_once_in_order(big_table, sort):
    sessions = session_factory(big_table)
    async with sessions() as session:
        rows = (await session.execute(text(
            "SELECT id, project, created_at, coalesce(reward, -1e308) FROM rollouts "
            "WHERE project = 'p3' OR project IS NULL"))).all()
        key = 2 if sort in ("newest", "oldest") else 3
        expected = [r[0] for r in sorted(rows, key=lambda r: (r[key], r[0]), reverse=sort in ("newest", "reward_high"))]
        seen, cursor = [], None
        while True:
            page = await browse.list_rollouts(session, "p3", browse.RolloutFilter(), sort=sort, limit=200,
                                              cursor=cursor)
            seen += [r["rollout_id"] for r in page["data"]]
            cursor = page["next"]
            if cursor is None:
                break
    assert seen == expected


async def test_the_total_is_capped_and_counted_on_the_first_page_only(big_table, monkeypatch):
    monkeypatch.setattr(browse, "TOTAL_CAP", 500)
    sessions = session_factory(big_table)
    async with sessions() as session:
        few = await browse.list_rollouts(session, None, browse.RolloutFilter(agent="a1", task_id="t1"))
        many = await browse.list_rollouts(session, "p3", browse.RolloutFilter())
        later = await browse.list_rollouts(session, "p3", browse.RolloutFilter(), cursor=many["next"])
        exact = (await session.execute(text("SELECT count(*) FROM rollouts WHERE agent = 'a1' AND task_id = 't1'")))
    assert few["total"] == exact.scalar_one() and few["total_exact"] is True
    assert many["total"] == 500 and many["total_exact"] is False  # p3 and no project: about 1,900
    assert later["total"] is None and later["data"]


async def test_a_query_past_the_time_limit_ends_with_too_slow(big_table, monkeypatch):
    monkeypatch.setattr(browse, "QUERY_TIMEOUT_MS", 50)

    @browse._time_limited_query
    async def slow(session):
        await browse.time_limited(session)
        await session.execute(text("SELECT pg_sleep(2)"))

    sessions = session_factory(big_table)
    async with sessions() as session:
        with pytest.raises(browse.TooSlow):
            await slow(session)


class Writer:
    def __init__(self):
        self.synced = 0

    async def sync(self):
        self.synced += 1


@pytest.mark.parametrize("query", ["sort=sideways", "cursor=bm90IGEgY3Vyc29y", "status=maybe", "limit=0",
                                   "sort=newest&cursor=" + browse.encode_cursor(1.0, "a")])
async def test_a_refused_list_query_does_not_wait_on_the_writer(query):
    app = web.Application()
    writer = Writer()
    app[STATE] = SimpleNamespace(writer=writer)
    request = make_mocked_request("GET", "/ui/api/rollouts?" + query, app=app)
    with pytest.raises(InvalidRequest):
        await ui.list_rollouts(request)
    assert writer.synced == 0


@pytest.mark.parametrize("sort", SORTS)
async def test_pages_on_sqlite_walk_every_row_once(sqlite_url, sort):
    """The same statements on the embedded database (row values, the union of two ranges, the expression)."""
    database = open_database(sqlite_url)
    sessions = session_factory(database)
    start = datetime(2026, 11, 1, tzinfo=timezone.utc)
    rng = random.Random(7)
    async with sessions() as session, session.begin():
        for i in range(130):
            session.add(Rollout(id=uuid.uuid4().hex, project=rng.choice(["p", "q", None]), status="finished",
                                reward=rng.choice([None, 0.0, 0.5, 1.0]), call_count=0,
                                created_at=start + timedelta(seconds=i // 4)))
    async with sessions() as session:
        every = (await session.execute(text("SELECT id, project, created_at, reward FROM rollouts"))).all()
        seen, cursor = [], None
        while True:
            page = await browse.list_rollouts(session, "p", browse.RolloutFilter(), sort=sort, limit=7, cursor=cursor)
            seen += [(r["rollout_id"], r["created_at"], r["reward"]) for r in page["data"]]
            cursor = page["next"]
            if cursor is None:
                break
    await database.dispose()
    visible = [r for r in every if r[1] in ("p", None)]
    assert sorted(r[0] for r in seen) == sorted(r[0] for r in visible) and len(seen) == len(visible)
    keys = [(c if sort in ("newest", "oldest") else (browse.LOWEST if w is None else w), i) for i, c, w in seen]
    assert keys == sorted(keys, reverse=sort in ("newest", "reward_high"))
