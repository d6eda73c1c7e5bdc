"""What goes to the rejected file goes there once, and is counted once, however often the replay around it fails
and starts again, and across a stop and a start: a spool line no call can be read from, and a call the database
refuses in a batch whose other calls meet an outage. The writer against the real Postgres."""
from __future__ import annotations

import asyncio
import uuid

import orjson
import pytest

import proxy.recording.writer
from core.settings import WriterSettings
from proxy.metrics import ProxyMetrics
from proxy.recording.lines import encode
from proxy.recording.writer import CaptureWriter
from tests.recording.conftest import record, seqs_in_order


def rejected(writer: CaptureWriter) -> list[dict]:
    return [orjson.loads(line) for line in writer.rejected.path.read_bytes().splitlines()]


def rejected_total(metrics: ProxyMetrics) -> float:
    return metrics.registry.get_sample_value("rlproxy_capture_calls_rejected_total") or 0


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    monkeypatch.setattr(proxy.recording.writer, "RETRY_SECONDS", 0.05)  # the writer retries a failed replay this often


async def test_an_unreadable_spool_line_is_set_aside_once_through_failed_replays_and_a_restart(sessions, tmp_path):
    settings = WriterSettings(spool_path=tmp_path / "spool.jsonl", durability="spool")
    rollout_id = uuid.uuid4().hex
    calls = [record(rollout_id) for _ in range(2)]
    newer = orjson.loads(encode(record(rollout_id)))
    newer["field_of_a_newer_version"] = 1  # a line an older proxy cannot read
    settings.spool_path.write_bytes(encode(calls[0]) + orjson.dumps(newer) + b"\n" + encode(calls[1]))

    # The database goes away in the middle of the replay, which is retried again and again, then the proxy stops.
    metrics = ProxyMetrics()
    writer = CaptureWriter(sessions, settings, metrics)
    attempts = []

    async def database_down(records, **_):
        attempts.append(len(records))
        return False

    writer.batches.write = database_down
    await writer.start()
    while len(attempts) < 4:
        await asyncio.sleep(0.02)
    await writer.close()
    assert writer.spool.segments  # its calls wait in the spool for the next start
    assert len(rejected(writer)) == 1 and rejected_total(metrics) == 1

    # The next start stores the calls; the line is in the rejected file once, counted by the first proxy only.
    metrics = ProxyMetrics()
    writer = CaptureWriter(sessions, settings, metrics)
    await writer.start()
    await writer.sync(timeout=15)
    assert await seqs_in_order(sessions, calls) == [1, 2]
    [kept] = rejected(writer)
    assert orjson.loads(kept["call"]["spool_line"]) == newer
    assert rejected_total(metrics) == 0
    await writer.close()


async def test_a_refused_call_is_set_aside_once_when_the_rest_of_its_batch_meets_an_outage(sessions, tmp_path):
    """The batch is split around the call the database refuses; the half after it cannot be written (the
    database went away), so the whole batch is replayed again later, and after a restart."""
    settings = WriterSettings(spool_path=tmp_path / "spool.jsonl", durability="spool")
    rollout_id = uuid.uuid4().hex
    before, refused, after = (record(rollout_id) for _ in range(3))
    refused.agent = "a" * 129  # longer than its column: Postgres refuses it
    settings.spool_path.write_bytes(b"".join(encode(c) for c in (before, refused, after)))

    metrics = ProxyMetrics()
    writer = CaptureWriter(sessions, settings, metrics)
    transaction, outage = writer.batches._transaction, []

    async def after_is_unreachable(records, may_repeat):
        ids = {r.id for r in records}
        if after.id in ids and refused.id not in ids:  # the refusal comes first: the batch is split around it
            outage.append(1)
            raise ConnectionResetError("the database went away")
        await transaction(records, may_repeat)

    writer.batches._transaction = after_is_unreachable
    await writer.start()
    while len(outage) < 4:  # replayed again and again
        await asyncio.sleep(0.02)
    await writer.close()
    assert await seqs_in_order(sessions, [before, refused, after]) == [1, None, None]
    assert [k["call"]["id"] for k in rejected(writer)] == [refused.id] and rejected_total(metrics) == 1

    metrics = ProxyMetrics()
    writer = CaptureWriter(sessions, settings, metrics)  # the database answers again
    await writer.start()
    await writer.sync(timeout=15)
    assert await seqs_in_order(sessions, [before, refused, after]) == [1, None, 2]
    assert [k["call"]["id"] for k in rejected(writer)] == [refused.id] and rejected_total(metrics) == 0
    await writer.close()
    assert not writer.spool.segments
