"""`spool` and `sync` durability: a call is in the spool before it is acknowledged (with `sync` on disk:
concurrent calls share one fsync), reaches the real Postgres exactly once, and leaves the spool once stored —
also after a crash, a torn write, or a database outage."""
from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import sys
import uuid

import orjson
import pytest
from sqlalchemy import select

from core.settings import WriterSettings
from proxy.errors import StoreUnavailable
from proxy.metrics import ProxyMetrics
from proxy.recording.lines import encode
from proxy.recording.spool import Spool, SpoolInUse
from proxy.recording.writer import CaptureWriter
from store.db import open_database, session_factory
from store.models import Call, Rollout
from tests.recording.conftest import count, record, seqs_in_order


def spool_files(settings: WriterSettings) -> list[str]:
    """The spool's segment files (not the lock file its process holds while it is open, nor the file naming the
    database its calls are for)."""
    return sorted(p.name for p in settings.spool_path.parent.glob(settings.spool_path.name + "*")
                  if not p.name.endswith((".lock", ".database")))


async def test_concurrent_calls_share_fsyncs_and_are_stored_once(sessions, tmp_path):
    settings = WriterSettings(spool_path=tmp_path / "spool.jsonl", durability="sync",
                              spool_segment_bytes=64 << 10)
    metrics = ProxyMetrics()
    writer = CaptureWriter(sessions, settings, metrics)
    await writer.start()
    rollout_id = uuid.uuid4().hex
    records = [record(rollout_id) for _ in range(300)]

    async def call(r):
        await writer.commit(r)
        assert writer.spool.durable_lsn > 0  # on disk when commit returns

    await asyncio.gather(*(call(r) for r in records))
    fsyncs = metrics.registry.get_sample_value("rlproxy_capture_spool_fsync_calls_count")
    assert 1 <= fsyncs < len(records) / 4  # group commit: many calls per fsync
    assert metrics.registry.get_sample_value("rlproxy_capture_spool_fsync_calls_sum") == len(records)
    assert len(spool_files(settings)) > 1  # the spool rotated (300 records > 64 KiB)

    await writer.sync()
    assert writer.spool.pending == 0 and await count(sessions, rollout_id) == 300
    assert spool_files(settings) == [spool_files(settings)[-1]]  # stored segments are deleted
    assert await seqs_in_order(sessions, records) == list(range(1, 301))
    await writer.close()
    assert not list(tmp_path.iterdir())  # a clean stop leaves no file, the lock file included


async def test_a_sync_call_the_disk_could_not_make_durable_is_stored_failed(sessions, tmp_path, monkeypatch):
    """Its agent is answered 503: the call is stored `store_error` (never trained on), not as an answer."""
    writer = CaptureWriter(sessions, WriterSettings(spool_path=tmp_path / "spool.jsonl", durability="sync"),
                           ProxyMetrics())
    await writer.start()
    rollout_id = uuid.uuid4().hex
    good, bad = record(rollout_id), record(rollout_id)
    await writer.commit(good)

    def failing_fsync(fds, directory):  # what a failing disk answers fdatasync
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr("proxy.recording.spool._sync", failing_fsync)
    with pytest.raises(StoreUnavailable):
        await writer.commit(bad)
    monkeypatch.undo()
    await writer.sync()
    async with sessions() as session:
        rows = dict((await session.execute(select(Call.id, Call.status).where(Call.rollout_id == rollout_id))).all())
    assert rows == {good.id: "ok", bad.id: "store_error"}
    await writer.close()
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("durability", ["spool", "sync"])
async def test_a_spool_left_by_a_crash_is_replayed_exactly_once(sessions, tmp_path, durability):
    settings = WriterSettings(spool_path=tmp_path / "spool.jsonl", durability=durability)
    rollout_id = uuid.uuid4().hex
    records = [record(rollout_id) for _ in range(40)]
    # A proxy stored the first 25 calls, then died with all 40 in its spool and a torn write at the end.
    writer = CaptureWriter(sessions, settings, ProxyMetrics())
    await writer.start()
    for r in records[:25]:
        await writer.commit(r)
    await writer.sync()
    writer._task.cancel()  # killed: nothing more is written to the database
    await writer.spool.append(records[25:])
    os.write(writer.spool.segments[-1].fd, b'{"id": "torn", "route": "ch')
    assert await count(sessions, rollout_id) == 25

    writer = CaptureWriter(sessions, settings, ProxyMetrics())
    assert writer.spool.pending == 41 and writer.spooling
    await writer.start()
    await writer.sync(timeout=15)
    assert await count(sessions, rollout_id) == 40 and writer.spool.pending == 0
    assert await seqs_in_order(sessions, records) == list(range(1, 41))
    async with sessions() as session:
        assert (await session.get(Rollout, rollout_id)).call_count == 40
    await writer.close()
    assert spool_files(settings) == []


async def test_a_whole_spool_line_another_version_wrote_is_set_aside_raw_not_dropped(sessions, tmp_path):
    """A proxy rolled back to an older version finds calls in its spool with a field it does not know: each is
    kept, raw, in the rejected file (an operator can replay it with the newer version), and the rest are stored."""
    settings = WriterSettings(spool_path=tmp_path / "spool.jsonl", durability="spool")
    rollout_id = uuid.uuid4().hex
    records = [record(rollout_id) for _ in range(3)]
    writer = CaptureWriter(sessions, settings, ProxyMetrics())
    await writer.start()
    writer._task.cancel()  # killed before anything reached the database
    await writer.spool.append(records[:2])
    newer = orjson.loads(encode(records[2]))
    newer["field_of_a_newer_version"] = 1
    os.write(writer.spool.segments[-1].fd, orjson.dumps(newer) + b"\n")

    metrics = ProxyMetrics()
    writer = CaptureWriter(sessions, settings, metrics)
    await writer.start()
    await writer.sync(timeout=15)
    assert await seqs_in_order(sessions, records) == [1, 2, None]
    [kept] = [orjson.loads(line) for line in writer.rejected.path.read_bytes().splitlines()]
    assert "field_of_a_newer_version" in kept["reason"]
    assert orjson.loads(kept["call"]["spool_line"]) == newer
    assert metrics.registry.get_sample_value("rlproxy_capture_calls_rejected_total") == 1
    await writer.close()


async def test_sync_calls_stay_acknowledged_through_a_database_outage(link, database_url, sessions, tmp_path):
    link, via_link = link
    settings = WriterSettings(spool_path=tmp_path / "spool.jsonl", durability="sync", flush_interval=0.01)
    database = open_database(via_link)
    writer = CaptureWriter(session_factory(database), settings, ProxyMetrics())
    await writer.start()
    rollout_id = uuid.uuid4().hex
    before, during, after = ([record(rollout_id) for _ in range(n)] for n in (10, 30, 10))
    for r in before:
        await writer.commit(r)
    await writer.sync()

    await link.cut()
    for r in during:
        await writer.commit(r)  # acknowledged: on disk, though the database is gone
    with pytest.raises(StoreUnavailable):
        await writer.sync(timeout=5)
    assert writer.spooling and writer.spool.pending == 30 and await count(sessions, rollout_id) == 10

    await link.open()
    for r in after:
        await writer.commit(r)
    await writer.sync(timeout=15)
    assert await count(sessions, rollout_id) == 50 and writer.spool.pending == 0 and not writer.spooling
    assert await seqs_in_order(sessions, before + during + after) == list(range(1, 51))
    await writer.close()
    await database.dispose()
    assert spool_files(settings) == []


@pytest.mark.parametrize("durability", ["batch", "spool", "sync"])
async def test_calls_beyond_a_full_queue_go_through_the_spool_in_order(sessions, tmp_path, durability):
    settings = WriterSettings(spool_path=tmp_path / "spool.jsonl", durability=durability, queue_size=4)
    metrics = ProxyMetrics()
    writer = CaptureWriter(sessions, settings, metrics)
    await writer.start()
    rollout_id = uuid.uuid4().hex
    records = [record(rollout_id) for _ in range(60)]
    for r in records:  # faster than any database: no chance for the writer to run in between
        writer.submit(r)
    assert writer.spooling and writer.awaiting_replay >= 56
    await writer.sync(timeout=15)
    assert await seqs_in_order(sessions, records) == list(range(1, 61))
    assert not writer.spooling and writer.awaiting_replay == 0
    await writer.close()
    assert spool_files(settings) == []


async def test_spool_mode_writes_each_call_before_its_answer_without_fsync(sessions, tmp_path):
    settings = WriterSettings(spool_path=tmp_path / "spool.jsonl", durability="spool", spool_segment_bytes=16 << 10)
    metrics = ProxyMetrics()
    writer = CaptureWriter(sessions, settings, metrics)
    await writer.start()
    rollout_id = uuid.uuid4().hex
    records = [record(rollout_id) for _ in range(120)]
    for r in records:
        await writer.commit(r)
        written = b"".join(p.read_bytes() for p in settings.spool_path.parent.glob("spool.jsonl*"))
        assert r.id.encode() in written  # in the file (the kernel has it) when the agent is answered
    assert not metrics.registry.get_sample_value("rlproxy_capture_spool_fsync_calls_count")

    await writer.sync()
    assert await seqs_in_order(sessions, records) == list(range(1, 121))
    assert len(spool_files(settings)) == 1  # full segments, stored, are deleted though never fsynced
    await writer.close()
    assert spool_files(settings) == []


def test_a_spool_is_refused_to_a_second_process_while_the_first_holds_it(tmp_path):
    path = tmp_path / "spool.jsonl"
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from pathlib import Path; from proxy.recording.spool import "
                               "Spool; spool = Spool(Path(sys.argv[1])); print('held', flush=True); sys.stdin.read()",
                               str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(SpoolInUse, match="give each proxy its own --spool-path"):
            Spool(path)
    finally:
        holder.kill()  # however it ends, its lock goes with it
        holder.wait()
    Spool(path)  # taken at once
