"""One call cannot stop the recording of the others: a call that cannot be written as JSON, or that the database
refuses, is set aside in the rejected file with its reason; if the writer fails anyway (here: the spool's folder
is gone while the database is down), it is started again and loses nothing. Real Postgres throughout."""
from __future__ import annotations

import asyncio
import shutil
import uuid

import orjson
import pytest

from core.settings import WriterSettings
from proxy.errors import StoreUnavailable
from proxy.metrics import ProxyMetrics
from proxy.recording.writer import CaptureWriter
from sqlalchemy import select, text

from store.db import open_database, session_factory
from store.models import Call, CallChoice
from tests.recording.conftest import call_count, record, seqs_in_order


def nested(depth: int):
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def poisoned(rollout_id: str):
    """Calls nothing can store as they are: nested past what orjson writes, a lone surrogate (what aiohttp makes
    of header bytes that are not UTF-8), an agent name longer than its column (an id is never cut)."""
    deep, surrogate, long_id = (record(rollout_id) for _ in range(3))
    deep.request = {"messages": [{"role": "user", "content": "hi", "x": nested(300)}]}
    surrogate.agent = "agent\udcff"
    long_id.agent = "a" * 129
    return [deep, surrogate, long_id]


def rejected_lines(writer: CaptureWriter) -> dict[str, str]:
    lines = [orjson.loads(line) for line in writer.rejected.path.read_bytes().splitlines()]
    return {line["call"]["id"]: line["reason"] for line in lines}


@pytest.mark.parametrize("durability", ["batch", "spool"])
async def test_calls_that_cannot_be_stored_are_set_aside_and_the_rest_are_stored(sessions, tmp_path, durability):
    settings = WriterSettings(spool_path=tmp_path / "spool.jsonl", durability=durability)
    metrics = ProxyMetrics()
    writer = CaptureWriter(sessions, settings, metrics)
    await writer.start()
    rollout_id = uuid.uuid4().hex
    good = [record(rollout_id) for _ in range(6)]
    bad = poisoned(rollout_id)
    for call in [good[0], good[1], bad[0], good[2], bad[1], good[3], bad[2], good[4], good[5]]:
        await writer.commit(call)
    await writer.sync()

    assert await seqs_in_order(sessions, good) == [1, 2, 3, 4, 5, 6]
    reasons = rejected_lines(writer)
    assert set(reasons) == {call.id for call in bad}
    assert "Recursion limit reached" in reasons[bad[0].id]
    assert "surrogates not allowed" in reasons[bad[1].id]
    assert "value too long for type character varying(128)" in reasons[bad[2].id]  # Postgres' own words
    assert metrics.registry.get_sample_value("rlproxy_capture_calls_rejected_total") == 3
    assert writer.running and not metrics.registry.get_sample_value("rlproxy_capture_writer_restarts_total")
    await writer.close()


async def test_the_writer_is_started_again_after_a_failure_and_loses_nothing(link, database_url, tmp_path):
    link, via_link = link
    folder = tmp_path / "spool"
    folder.mkdir()
    settings = WriterSettings(spool_path=folder / "spool.jsonl", durability="batch", flush_interval=0.01)
    metrics = ProxyMetrics()
    database = open_database(via_link)
    writer = CaptureWriter(session_factory(database), settings, metrics)
    await writer.start()
    rollout_id = uuid.uuid4().hex
    calls = [record(rollout_id) for _ in range(5)]

    await link.cut()
    shutil.rmtree(folder)  # the database is down and the calls have nowhere to wait: the writer fails
    for call in calls:
        writer.submit(call)
    stopped = []  # what /readyz and the gauge say between the failure and the restart
    for _ in range(200):
        await asyncio.sleep(0.01)
        if metrics.registry.get_sample_value("rlproxy_capture_writer_restarts_total"):
            stopped.append((writer.running, metrics.registry.get_sample_value("rlproxy_capture_writer_running")))
            if len(stopped) == 10:
                break
    assert (False, 0) in stopped

    folder.mkdir()
    await link.open()
    await writer.sync(timeout=15)  # answered once the calls it had in hand are stored
    assert writer.running and metrics.registry.get_sample_value("rlproxy_capture_writer_running") == 1
    direct = open_database(database_url)
    assert await seqs_in_order(session_factory(direct), calls) == [1, 2, 3, 4, 5]
    await direct.dispose()
    await writer.close()
    await database.dispose()


@pytest.mark.parametrize("state", ["disk_full", "read_only_sql_transaction", "query_canceled", "deadlock_detected"])
async def test_a_database_that_cannot_write_keeps_the_calls_waiting_not_set_aside(sessions, tmp_path, state):
    """The database answers (SELECT 1 works) but cannot take writes: its disk is full, it became a read-only
    standby, a statement timed out, a deadlock. Those are its state, not the calls': they wait in the spool and
    are stored once it can write again; none goes to the rejected file."""
    settings = WriterSettings(spool_path=tmp_path / "spool.jsonl", durability="batch", flush_interval=0.01)
    metrics = ProxyMetrics()
    writer = CaptureWriter(sessions, settings, metrics)
    await writer.start()
    rollout_id = uuid.uuid4().hex
    refuse = f"refuse_{rollout_id}"
    async with sessions() as session, session.begin():  # this rollout's rows only: other tests write beside it
        await session.execute(text(f"CREATE FUNCTION {refuse}() RETURNS trigger LANGUAGE plpgsql AS "
                                   f"$$ BEGIN RAISE EXCEPTION 'cannot write now' USING ERRCODE = '{state}'; END $$"))
        await session.execute(text(f"CREATE TRIGGER {refuse} BEFORE INSERT ON calls FOR EACH ROW WHEN "
                                   f"(NEW.rollout_id = '{rollout_id}') EXECUTE FUNCTION {refuse}()"))
    try:
        calls = [record(rollout_id) for _ in range(4)]
        for call in calls:
            writer.submit(call)
        for _ in range(100):
            await asyncio.sleep(0.02)
            if metrics.registry.get_sample_value("rlproxy_capture_write_errors_total"):
                break
        await asyncio.sleep(0.3)  # retries happen meanwhile; none may set a call aside
        assert metrics.registry.get_sample_value("rlproxy_capture_write_errors_total") >= 1
        assert not metrics.registry.get_sample_value("rlproxy_capture_calls_rejected_total")
        assert await seqs_in_order(sessions, calls) == [None] * 4
    finally:
        async with sessions() as session, session.begin():
            await session.execute(text(f"DROP TRIGGER {refuse} ON calls"))
            await session.execute(text(f"DROP FUNCTION {refuse}()"))
    await writer.sync(timeout=15)
    assert await seqs_in_order(sessions, calls) == [1, 2, 3, 4]
    assert not writer.rejected.path.exists() or not rejected_lines(writer)
    await writer.close()


@pytest.mark.parametrize("durability", ["batch", "spool"])
async def test_text_postgres_cannot_hold_as_it_is_is_stored_not_set_aside(sessions, tmp_path, durability):
    """What an agent or an engine may write that Postgres' text and JSONB refuse: a NUL character (a tool's output
    with binary bytes, a model writing U+0000), a model name or a finish reason longer than its column. The agent
    had its answer, so the call is stored: NUL as U+FFFD, long names cut; token ids and logprobs exact."""
    writer = CaptureWriter(sessions, WriterSettings(spool_path=tmp_path / "spool.jsonl", durability=durability),
                           ProxyMetrics())
    await writer.start()
    rollout_id = uuid.uuid4().hex
    calls = [record(rollout_id) for _ in range(4)]
    calls[0].request = {"messages": [{"role": "tool", "content": "ELF\x00\x01 and a literal \\u0000"}]}
    calls[1].response = {"choices": [{"message": {"content": "a\x00b"}}]}
    calls[1].error = "engine said \x00"
    calls[2].model = "m" * 300
    calls[3].choices[0].finish_reason = "an engine's own reason, longer than 32 characters"
    for call in calls:
        await writer.commit(call)
    await writer.sync()

    assert await seqs_in_order(sessions, calls) == [1, 2, 3, 4]
    assert not writer.rejected.path.exists()
    async with sessions() as session:
        rows = {row.id: row for row in (await session.execute(
            select(Call).where(Call.rollout_id == rollout_id))).scalars()}
        choice = await session.get(CallChoice, (calls[3].id, 0))
    assert rows[calls[0].id].request["messages"][0]["content"] == "ELF\ufffd\x01 and a literal \\u0000"
    assert rows[calls[1].id].response["choices"][0]["message"]["content"] == "a\ufffdb"
    assert rows[calls[1].id].error == "engine said \ufffd"
    assert rows[calls[2].id].model == "m" * 255 + "…"
    assert choice.finish_reason == "an engine's own reason, longer …" and choice.token_ids == [4, 5]
    assert rows[calls[0].id].prompt_token_ids == [1, 2, 3]
    await writer.close()


async def test_a_call_stored_just_before_the_writer_failed_is_not_numbered_twice(sessions, tmp_path):
    """The writer fails after its batch was committed: the calls it held are written again, and the retry must
    find them stored (numbered once, call_count right), not take them for new ones."""

    metrics = ProxyMetrics()
    writer = CaptureWriter(sessions, WriterSettings(spool_path=tmp_path / "spool.jsonl", durability="batch"),
                           metrics)
    write = writer.batches.write

    async def fails_after_the_commit(records, **kw):
        stored = await write(records, **kw)
        if not metrics.registry.get_sample_value("rlproxy_capture_writer_restarts_total"):
            raise RuntimeError("the writer failed after the commit")
        return stored

    writer.batches.write = fails_after_the_commit
    await writer.start()
    rollout_id = uuid.uuid4().hex
    calls = [record(rollout_id) for _ in range(3)]
    for call in calls:
        writer.submit(call)
    await writer.sync(timeout=15)
    assert metrics.registry.get_sample_value("rlproxy_capture_writer_restarts_total") == 1
    assert await seqs_in_order(sessions, calls) == [1, 2, 3]
    assert await call_count(sessions, rollout_id) == 3
    await writer.close()


async def test_calls_the_failed_writer_held_are_stored_before_the_calls_after_them(sessions, tmp_path):
    """While the writer starts again, newer calls fill the queue and go to the spool: the calls it held when it
    failed are older, and must be numbered first."""
    metrics = ProxyMetrics()
    settings = WriterSettings(spool_path=tmp_path / "spool.jsonl", durability="batch", queue_size=2,
                              flush_interval=0.05)
    writer = CaptureWriter(sessions, settings, metrics)
    write = writer.batches.write
    failed = asyncio.Event()

    async def fails_once(records, **kw):
        if not failed.is_set():
            failed.set()
            raise RuntimeError("the writer failed before the commit")
        return await write(records, **kw)

    writer.batches.write = fails_once
    await writer.start()
    rollout_id = uuid.uuid4().hex
    older = [record(rollout_id) for _ in range(2)]
    newer = [record(rollout_id) for _ in range(5)]
    for call in older:
        writer.submit(call)
    await failed.wait()
    for call in newer:  # before the restart (0.1 s later): the queue of 2 overflows into the spool
        writer.submit(call)
    assert writer.spooling
    await writer.sync(timeout=15)
    assert await seqs_in_order(sessions, older + newer) == list(range(1, 8))
    await writer.close()


async def test_a_call_too_slow_to_store_is_split_out_and_set_aside_and_the_rest_stored(database_url, tmp_path):
    """The database has a statement timeout and one call (a huge body) always runs past it: its batch is split,
    the calls around it are stored in order, and after a few tries alone it is set aside (the same call without
    its body is stored in time, so the call is the slow part, not the database)."""
    database = open_database(database_url)
    async with database.begin() as conn:
        await conn.execute(text(
            "CREATE OR REPLACE FUNCTION slow_big_calls() RETURNS trigger AS $$ BEGIN "
            "IF length(NEW.request::text) > 100000 THEN PERFORM pg_sleep(2); END IF; RETURN NEW; END $$ "
            "LANGUAGE plpgsql"))
        await conn.execute(text("CREATE TRIGGER slow_big_calls BEFORE INSERT ON calls FOR EACH ROW "
                                "EXECUTE FUNCTION slow_big_calls()"))
    from sqlalchemy.ext.asyncio import create_async_engine

    timed = create_async_engine(database_url, connect_args={"server_settings": {"statement_timeout": "300"}})
    try:
        metrics = ProxyMetrics()
        writer = CaptureWriter(session_factory(timed), WriterSettings(spool_path=tmp_path / "spool.jsonl",
                                                                      durability="spool"), metrics)
        await writer.start()
        rollout_id = uuid.uuid4().hex
        calls = [record(rollout_id) for _ in range(6)]
        calls[2].request = {"messages": [{"role": "user", "content": "x" * 200_000}]}
        for call in calls:
            await writer.commit(call)
        for _ in range(60):  # a reward request meanwhile is answered 503, as in an outage; retried each second
            try:
                await writer.sync(timeout=30)
                break
            except StoreUnavailable:
                await asyncio.sleep(0.5)
        sessions = session_factory(database)
        assert await seqs_in_order(sessions, calls) == [1, 2, None, 3, 4, 5]
        assert list(rejected_lines(writer)) == [calls[2].id]
        assert "statement timeout" in rejected_lines(writer)[calls[2].id]
        await writer.close()
    finally:
        async with database.begin() as conn:
            await conn.execute(text("DROP TRIGGER slow_big_calls ON calls"))
            await conn.execute(text("DROP FUNCTION slow_big_calls()"))
        await timed.dispose()
        await database.dispose()
