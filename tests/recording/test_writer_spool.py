"""Nothing accepted is lost (`batch` durability): with the connection to the real Postgres cut, calls go to the
spool, and they reach the database exactly once when it answers again or when the next proxy starts."""
from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select

from core.settings import WriterSettings
from proxy.errors import StoreUnavailable
from proxy.metrics import ProxyMetrics
from proxy.recording.writer import CaptureWriter
from store.db import open_database, session_factory
from store.models import Call
from tests.recording.conftest import count, record


async def test_calls_survive_a_database_outage_and_arrive_once_in_order(link, database_url, tmp_path):
    link, via_link = link
    settings = WriterSettings(spool_path=tmp_path / "spool.jsonl", durability="batch", flush_interval=0.01)
    metrics = ProxyMetrics()
    database = open_database(via_link)
    writer = CaptureWriter(session_factory(database), settings, metrics)
    await writer.start()
    direct = open_database(database_url)
    check = session_factory(direct)
    rollout_id = uuid.uuid4().hex
    before = [record(rollout_id) for _ in range(20)]
    during = [record(rollout_id) for _ in range(30)]

    for r in before:
        writer.submit(r)
    await writer.sync()
    assert await count(check, rollout_id) == 20

    await link.cut()
    for r in during:
        writer.submit(r)
    with pytest.raises(StoreUnavailable):
        await writer.sync(timeout=5)
    assert writer.spool.pending == 30 and await count(check, rollout_id) == 20

    await link.open()  # the database answers again
    await writer.sync(timeout=15)
    assert await count(check, rollout_id) == 50 and writer.spool.pending == 0
    async with check() as session:
        seqs = dict((await session.execute(select(Call.id, Call.seq).where(Call.rollout_id == rollout_id))).all())
    assert [seqs[r.id] for r in before + during] == list(range(1, 51))
    assert metrics.rows_spooled._value.get() == 30

    await writer.close()
    await database.dispose()
    await direct.dispose()


async def test_a_spool_left_by_a_stopped_proxy_is_replayed_by_the_next(link, database_url, tmp_path):
    link, via_link = link
    settings = WriterSettings(spool_path=tmp_path / "spool.jsonl", durability="batch", flush_interval=0.01)
    rollout_id = uuid.uuid4().hex
    await link.cut()
    database = open_database(via_link)
    writer = CaptureWriter(session_factory(database), settings, ProxyMetrics())
    await writer.start()
    for _ in range(10):
        writer.submit(record(rollout_id))
    await writer.close(timeout=5)
    await database.dispose()
    assert settings.spool_path.exists()

    await link.open()
    database = open_database(via_link)
    writer = CaptureWriter(session_factory(database), settings, ProxyMetrics())
    assert writer.spool.pending == 10
    await writer.start()
    await writer.sync(timeout=15)
    await writer.close()
    await database.dispose()
    direct = open_database(database_url)
    assert await count(session_factory(direct), rollout_id) == 10
    await direct.dispose()
    assert not settings.spool_path.exists()
