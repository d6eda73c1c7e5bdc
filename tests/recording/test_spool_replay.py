"""A spool replayed after a stop or a crash stores each call once, numbered once, in the order its rollout made
them: also when the spool holds a call twice, when a stop cuts a replay short, and when the queue overflows
while a write is failing (`batch` durability). The writer against the real Postgres."""
from __future__ import annotations

import asyncio
import uuid

import orjson

from core.settings import WriterSettings
from proxy.metrics import ProxyMetrics
from proxy.recording.lines import encode
from proxy.recording.writer import CaptureWriter
from store.models import Rollout
from tests.recording.conftest import call_count, record, seqs_in_order, spooled_ids


async def test_a_call_held_twice_in_the_spool_is_stored_once_and_numbered_once(sessions, tmp_path):
    settings = WriterSettings(spool_path=tmp_path / "spool.jsonl", durability="spool")
    rollout_id = uuid.uuid4().hex
    calls = [record(rollout_id) for _ in range(4)]
    # What a stop that cut a replay short left behind (before it was fixed): the last two calls twice.
    settings.spool_path.write_bytes(b"".join(encode(c) for c in calls + calls[2:]))

    writer = CaptureWriter(sessions, settings, ProxyMetrics())
    await writer.start()
    await writer.sync(timeout=15)
    assert await seqs_in_order(sessions, calls) == [1, 2, 3, 4]
    assert await call_count(sessions, rollout_id) == 4
    await writer.close()


async def test_a_stop_that_cuts_a_replay_short_leaves_each_call_once_in_the_spool(sessions, tmp_path):
    """SIGTERM while the database hangs in the middle of a replay: the calls the writer held are in the spool
    already; the stop must not write them there again (a spool holding a call twice stored it twice)."""
    settings = WriterSettings(spool_path=tmp_path / "spool.jsonl", durability="batch", flush_interval=0.01)
    writer = CaptureWriter(sessions, settings, ProxyMetrics())
    attempts = []

    async def unreachable_then_hanging(records, **_):
        attempts.append(len(records))
        if len(attempts) == 1:
            return False  # the database is down: the batch goes to the spool
        await asyncio.Event().wait()  # then it hangs: a replay that never ends

    writer.batches.write = unreachable_then_hanging
    await writer.start()
    rollout_id = uuid.uuid4().hex
    calls = [record(rollout_id) for _ in range(10)]
    for call in calls[:5]:
        writer.submit(call)
    while not writer.spooling:
        await asyncio.sleep(0.01)
    for call in calls[5:]:
        writer.submit(call)
    # A reward request waits for them (`sync`): they are spooled behind the backlog, then the replay hangs.
    reward = asyncio.ensure_future(writer.sync(timeout=30))
    while len(attempts) < 2:
        await asyncio.sleep(0.01)
    await writer.close(timeout=0.5)
    reward.cancel()
    assert spooled_ids(settings) == [c.id for c in calls]

    writer = CaptureWriter(sessions, settings, ProxyMetrics())
    await writer.start()
    await writer.sync(timeout=15)
    assert await seqs_in_order(sessions, calls) == list(range(1, 11))
    assert await call_count(sessions, rollout_id) == 10
    await writer.close()


async def test_calls_that_overflow_the_queue_during_a_failing_write_stay_behind_it(sessions, tmp_path):
    """`batch` durability: a write is slow, then fails (the database went away), while the agent's next calls
    fill the queue and go to the spool. The batch in hand is older than all of them: it must be stored first."""
    settings = WriterSettings(spool_path=tmp_path / "spool.jsonl", durability="batch", queue_size=4,
                              batch_size=4, flush_interval=0.01)
    writer = CaptureWriter(sessions, settings, ProxyMetrics())
    store = writer.batches.write
    failing = asyncio.Event()

    async def slow_then_unreachable(records, **kwargs):
        if not failing.is_set():
            failing.set()
            await asyncio.sleep(0.3)
            return False
        return await store(records, **kwargs)

    writer.batches.write = slow_then_unreachable
    await writer.start()
    rollout_id = uuid.uuid4().hex
    calls = [record(rollout_id) for _ in range(24)]
    for call in calls[:4]:
        writer.submit(call)
    await failing.wait()  # those four are in hand
    for call in calls[4:]:
        writer.submit(call)  # past the queue's 4: to the spool
    await writer.sync(timeout=15)
    assert await seqs_in_order(sessions, calls) == list(range(1, 25))
    assert await call_count(sessions, rollout_id) == 24
    await writer.close()


async def test_calls_of_a_rollout_pruned_while_they_waited_are_set_aside_not_stored(sessions, tmp_path):
    """The operator pruned the rollout (trained, past the age) while two of its calls sat in a spool: they must not
    bring it back as a new open rollout numbered from 1."""
    from datetime import timedelta

    from store.models import utcnow
    from store.retention import prune

    settings = WriterSettings(spool_path=tmp_path / "spool.jsonl", durability="spool")
    rollout_id = uuid.uuid4().hex
    calls = [record(rollout_id) for _ in range(4)]
    writer = CaptureWriter(sessions, settings, ProxyMetrics())
    await writer.start()
    for call in calls[:2]:
        await writer.commit(call)
    await writer.sync()
    await writer.close()
    async with sessions() as session, session.begin():
        rollout = await session.get(Rollout, rollout_id)
        rollout.status, rollout.trained_at = "finished", utcnow()
        rollout.created_at = utcnow() - timedelta(days=8)
    await prune(sessions, utcnow() - timedelta(days=7))
    settings.spool_path.write_bytes(b"".join(encode(c) for c in calls[2:]))  # left by a proxy stopped meanwhile

    metrics = ProxyMetrics()
    writer = CaptureWriter(sessions, settings, metrics)
    await writer.start()
    await writer.sync(timeout=15)
    async with sessions() as session:
        assert await session.get(Rollout, rollout_id) is None
    assert await seqs_in_order(sessions, calls) == [None] * 4
    kept = [orjson.loads(line) for line in writer.rejected.path.read_bytes().splitlines()]
    assert [k["call"]["id"] for k in kept] == [c.id for c in calls[2:]]
    assert all("was pruned" in k["reason"] for k in kept)
    assert metrics.registry.get_sample_value("rlproxy_capture_calls_rejected_total") == 2

    # An agent opening a new rollout under the pruned id afterwards: its calls were acknowledged too, and are stored
    after = record(rollout_id)
    await writer.commit(after)
    await writer.sync()
    assert await seqs_in_order(sessions, [after]) == [1]
    assert await call_count(sessions, rollout_id) == 1
    await writer.close()
    assert writer.spool.pending == 0


async def test_a_replay_batch_is_bounded_by_bytes_as_well_as_calls(sessions, tmp_path):
    settings = WriterSettings(spool_path=tmp_path / "spool.jsonl", durability="spool", batch_size=256)
    rollout_id = uuid.uuid4().hex
    calls = [record(rollout_id) for _ in range(12)]
    for call in calls:
        call.request = {"messages": [{"role": "user", "content": "x" * 100_000}]}  # ~100 KB each
    settings.spool_path.write_bytes(b"".join(encode(c) for c in calls))

    writer = CaptureWriter(sessions, settings, ProxyMetrics())
    writer.replay_bytes = 250_000
    sizes = []
    write = writer.batches.write

    async def measured(records, **kw):
        sizes.append(len(records))
        return await write(records, **kw)

    writer.batches.write = measured
    await writer.start()
    await writer.sync(timeout=15)
    assert sizes == [2] * 6  # not one batch of 12: at most 250 KB of lines each
    assert await seqs_in_order(sessions, calls) == list(range(1, 13))
    await writer.close()
