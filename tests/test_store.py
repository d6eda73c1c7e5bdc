"""The store on both databases it supports: Postgres (production) and SQLite (the embedded default)."""
from __future__ import annotations

import asyncio
import re
import uuid

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import select, text

from store import events, policies, rollouts
from store.calls import write_calls
from store.db import open_database
from store.errors import Conflict, NotFound
from store.models import Base, Call, Rollout, RolloutEvent
from store.records import CallRecord, ChoiceRecord
from store.models import utcnow


def call(rollout_id: str | None, prompt: list[int], completion: list[int], agent: str | None = "a") -> CallRecord:
    return CallRecord(id=uuid.uuid4().hex, route="chat", started_at=utcnow(), rollout_id=rollout_id, agent=agent,
                      prompt_token_ids=prompt,
                      choices=[ChoiceRecord(0, completion, [-0.5] * len(completion), "stop")])


async def test_migrations_match_the_models(sessions):
    async with sessions() as session:
        conn = await session.connection()
        diff = await conn.run_sync(lambda c: compare_metadata(MigrationContext.configure(c), Base.metadata))
    assert diff == []


async def test_token_ids_are_typed_arrays_on_postgres(database_url):
    database = open_database(database_url)
    async with database.connect() as conn:
        types = dict((await conn.execute(text(
            "SELECT column_name, udt_name FROM information_schema.columns "
            "WHERE table_name IN ('calls', 'call_choices') AND column_name IN "
            "('prompt_token_ids', 'token_ids', 'logprobs')"))).all())
    await database.dispose()
    assert types == {"prompt_token_ids": "_int4", "token_ids": "_int4", "logprobs": "_float4"}


async def test_a_batch_gets_sequence_numbers_and_prefix_links(sessions):
    rollout_id = uuid.uuid4().hex
    first = call(rollout_id, [1, 2], [3, 4])
    second = call(rollout_id, [1, 2, 3, 4, 5], [6])
    third = call(rollout_id, [1, 2, 3, 4, 5, 60, 61], [7])  # the agent re-encoded the answer [6]
    other_agent = call(rollout_id, [8], [9], agent="b")
    async with sessions() as session, session.begin():
        written = await write_calls(session, [first, second])
    async with sessions() as session, session.begin():
        written += await write_calls(session, [third, other_agent])

    assert [(w.seq, w.prefix_kind) for w in written] == [
        (1, "first"), (2, "extends"), (3, "retokenized"), (4, "first")]
    async with sessions() as session:
        rollout = await session.get(Rollout, rollout_id)
        assert rollout.call_count == 4 and rollout.status == "open"
        data = await rollouts.get_rollout(session, rollout_id)
    assert data["calls"][1]["prefix_parent_id"] == first.id
    assert data["calls"][1]["completion_logprobs"] == [-0.5]


async def test_replaying_a_batch_stores_each_call_once(sessions):
    rollout_id = uuid.uuid4().hex
    batch = [call(rollout_id, [1], [2]), call(None, [3], [4])]
    for _ in range(2):
        async with sessions() as session, session.begin():
            await write_calls(session, batch)
    async with sessions() as session:
        ids = (await session.execute(select(Call.id).where(Call.id.in_([c.id for c in batch])))).scalars().all()
        assert sorted(ids) == sorted(c.id for c in batch)
        assert (await session.get(Rollout, rollout_id)).call_count == 1


async def test_final_reward_is_idempotent_and_conflicts_are_refused(sessions):
    async with sessions() as session, session.begin():
        await rollouts.create_rollout(session, "r-" + uuid.uuid4().hex, task_id="t")
        rollout_id = (await session.execute(select(Rollout.id).order_by(Rollout.created_at.desc()))).scalars().first()
    async with sessions() as session, session.begin():
        assert (await rollouts.post_reward(session, rollout_id, 1.0)).created
    async with sessions() as session, session.begin():
        assert not (await rollouts.post_reward(session, rollout_id, 1.0)).created
    with pytest.raises(Conflict):
        async with sessions() as session, session.begin():
            await rollouts.post_reward(session, rollout_id, 0.0)
    with pytest.raises(NotFound):
        async with sessions() as session, session.begin():
            await rollouts.post_reward(session, "missing", 1.0)
    with pytest.raises(ValueError):
        async with sessions() as session, session.begin():
            await rollouts.post_reward(session, rollout_id, float("nan"))
    with pytest.raises(ValueError, match="between"):  # finite, but past what group statistics can square
        async with sessions() as session, session.begin():
            await rollouts.post_reward(session, rollout_id, 1e300)


async def test_one_active_policy_and_rollback_to_base(sessions):
    async with sessions() as session, session.begin():
        start = await policies.next_version(session)
        names = {}  # version -> the adapter name its row keeps (rlproxy-vN and a random part)
        for version in (start, start + 1):
            row = await policies.add_candidate(session, version, f"/adapters/v{version}", parent_version=None,
                                               base_model="m")
            names[version] = row.name
        await policies.activate(session, start)
    assert re.fullmatch(rf"rlproxy-v{start + 1}-[0-9a-f]{{8}}", names[start + 1])
    async with sessions() as session, session.begin():
        assert (await policies.active_policy(session)).version == start
        await policies.activate(session, start + 1)
    async with sessions() as session, session.begin():
        active = await policies.active_policy(session)
        assert (active.version, active.name) == (start + 1, names[start + 1])
        listed = {p["version"]: p["status"] for p in await policies.list_policies(session)}
        assert listed[start] == "retired" and listed[0] == "retired"
        await policies.activate(session, 0)
    async with sessions() as session:
        assert await policies.active_policy(session) == policies.BASE


async def test_activation_that_expects_another_active_version_changes_nothing(sessions):
    """A trainer publishes what it trained from the version it saw active; an operator's rollback since wins."""
    async with sessions() as session, session.begin():
        start = await policies.next_version(session)
        for version in (start, start + 1):
            await policies.add_candidate(session, version, f"/adapters/v{version}", parent_version=None,
                                         base_model="m", metrics={"reward_mean": 0.5})
        await policies.activate(session, start)
    with pytest.raises(Conflict, match=f"serves v{start} now, not v0"):
        async with sessions() as session, session.begin():
            await policies.activate(session, start + 1, replacing=0)
    async with sessions() as session, session.begin():
        assert (await policies.active_policy(session)).version == start
        listed = {p["version"]: p for p in await policies.list_policies(session)}
        seen_by_a_project = {p["version"]: p for p in await policies.list_policies(session, project="alpha")}
        assert listed[start]["status"] == "active" and listed[start + 1]["status"] == "candidate"
        assert listed[start]["path"] == f"/adapters/v{start}" and listed[start]["metrics"] == {"reward_mean": 0.5}
        assert seen_by_a_project[start]["path"] is None and seen_by_a_project[start]["metrics"] is None
        await policies.activate(session, start + 1, replacing=start)
        await policies.activate(session, 0)


@pytest.mark.parametrize("values", [[i / 10 for i in range(12)], [0.5] * 12], ids=["different", "identical"])
async def test_concurrent_final_rewards_close_a_rollout_once(sessions, values):
    """Twelve transactions (within the connection pool) that all read the rollout open before any of them
    writes, as concurrent requests do on SQLite (it ignores `FOR UPDATE`): one closes it, the others answer from
    what it stored: the same reward is a no-op, a different one a conflict."""
    rollout_id = uuid.uuid4().hex
    async with sessions() as session, session.begin():
        await rollouts.create_rollout(session, rollout_id)

    everyone_read_it = asyncio.Barrier(len(values))

    async def post(value: float) -> float | str:
        try:
            async with sessions() as session, session.begin():
                assert (await session.get(Rollout, rollout_id)).status == "open"
                await everyone_read_it.wait()
                result = await rollouts.post_reward(session, rollout_id, value)
                return value if result.created else "same"
        except Conflict:
            return "conflict"

    outcomes = await asyncio.gather(*(post(value) for value in values))
    [stored] = [o for o in outcomes if isinstance(o, float)]
    others = "conflict" if len(set(values)) > 1 else "same"
    assert sorted(o for o in outcomes if o != stored) == [others] * (len(values) - 1)
    async with sessions() as session:
        data = await rollouts.get_rollout(session, rollout_id)
    assert (data["reward"], [r["value"] for r in data["rewards"]]) == (stored, [stored])


async def test_events_are_rows_within_a_budget_and_events_kept_in_metadata_still_read(sessions):
    """A rollout from before migration 0008 holds its events in its metadata: they are read back first and count
    towards the budget; later events are rows, and one past the budget is refused with the earlier kept."""
    rollout_id = uuid.uuid4().hex
    old = {"event_type": "log", "data": "from metadata", "at": "2026-11-01T00:00:00+00:00"}
    async with sessions() as session, session.begin():
        await rollouts.create_rollout(session, rollout_id, metadata={"events": [old], "task": "t"})
    for number in range(3):
        async with sessions() as session, session.begin():
            await events.add_event(session, rollout_id, "span", {"n": number}, max_events=4)
    with pytest.raises(events.TooManyEvents, match="holds 4 events"):
        async with sessions() as session, session.begin():
            await events.add_event(session, rollout_id, "span", {"n": 3}, max_events=4)
    async with sessions() as session:
        data = await rollouts.get_rollout(session, rollout_id)
        rows = (await session.execute(select(RolloutEvent.data).where(RolloutEvent.rollout_id == rollout_id)))
        assert sorted(d["n"] for (d,) in rows) == [0, 1, 2]
    assert data["metadata"]["task"] == "t"
    assert [(e["event_type"], e["data"]) for e in data["metadata"]["events"]] == [
        ("log", "from metadata"), ("span", {"n": 0}), ("span", {"n": 1}), ("span", {"n": 2})]


async def test_concurrent_events_never_overshoot_the_budget(sessions):
    """Twelve events at once for a rollout that keeps five: five stored, seven refused, on SQLite too (which
    ignores the row lock): the count and the insert are one statement."""
    rollout_id = uuid.uuid4().hex
    async with sessions() as session, session.begin():
        await rollouts.create_rollout(session, rollout_id)

    async def add(number: int) -> bool:
        try:
            async with sessions() as session, session.begin():
                await events.add_event(session, rollout_id, "span", {"n": number}, max_events=5)
            return True
        except events.TooManyEvents:
            return False

    outcomes = await asyncio.gather(*(add(number) for number in range(12)))
    assert sorted(outcomes) == [False] * 7 + [True] * 5
    async with sessions() as session:
        assert len((await rollouts.get_rollout(session, rollout_id))["metadata"]["events"]) == 5


async def test_a_rollout_reads_back_page_by_page_with_each_call_and_reward_once(sessions):
    rollout_id = uuid.uuid4().hex
    batch = [call(rollout_id, [1] * (i + 1), [2]) for i in range(7)]
    async with sessions() as session, session.begin():
        await write_calls(session, batch)
    async with sessions() as session, session.begin():
        for record in batch:
            await rollouts.post_reward(session, rollout_id, 0.5, call_id=record.id)
        await rollouts.post_reward(session, rollout_id, 1.0)

    pages, after = [], None
    while True:
        async with sessions() as session:
            page = await rollouts.get_rollout(session, rollout_id, limit=3, after=after)
        pages.append(page)
        if page["next"] is None:
            break
        after = page["next"]
    assert [[c["seq"] for c in page["calls"]] for page in pages] == [[1, 2, 3], [4, 5, 6], [7]]
    assert [page["next"] for page in pages] == [3, 6, None]
    for page in pages:  # each page: its calls' rewards and the rollout's final reward
        assert sorted(r["call_id"] or "final" for r in page["rewards"]) == sorted(
            [c["call_id"] for c in page["calls"]] + ["final"])
    async with sessions() as session:
        whole = await rollouts.get_rollout(session, rollout_id)
    assert [c["call_id"] for c in whole["calls"]] == [record.id for record in batch]
    assert whole["next"] is None and len(whole["rewards"]) == 8
