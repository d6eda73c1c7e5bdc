"""A spool's calls go to the database they were written for: a proxy started on the same spool with another
`--database-url` refuses to start (the calls stay on disk), the same database takes them, and deleting the file
that names the database hands them to the new one. On Postgres (two databases of one server) and SQLite."""
from __future__ import annotations

import uuid
from pathlib import Path

import orjson
import pytest

from core.settings import WriterSettings
from migrations.apply import upgrade
from proxy.metrics import ProxyMetrics
from proxy.recording.spool import SpoolInUse
from proxy.recording.identity import SpoolForeign
from proxy.recording.writer import CaptureWriter
from store.db import open_database, session_factory
from tests.recording.conftest import record, seqs_in_order, spooled_ids


@pytest.fixture(params=["postgres", "sqlite"])
def two_databases(request, tmp_path):
    """The URLs of two distinct, migrated databases of one kind."""
    if request.param == "postgres":
        return request.getfixturevalue("database_url"), request.getfixturevalue("own_database_url")
    urls = []
    for name in ("first.db", "second.db"):
        urls.append(f"sqlite+aiosqlite:///{tmp_path / name}")
        upgrade(urls[-1])
    return urls


class Proxy:
    """A writer on a database, as `rlproxy serve --database-url URL --spool-path ...` runs it."""

    def __init__(self, url: str, settings: WriterSettings) -> None:
        self.database = open_database(url)
        self.sessions = session_factory(self.database)
        self.writer = CaptureWriter(self.sessions, settings, ProxyMetrics())

    async def stop(self) -> None:
        await self.writer.close()
        await self.database.dispose()


async def killed_with_calls_in_the_spool(url: str, settings: WriterSettings, calls) -> None:
    """A proxy that spooled `calls` and died before its database ever answered."""
    proxy = Proxy(url, settings)
    await proxy.writer.start()  # claims the spool for its database: by address, as it has not answered yet
    proxy.writer._task.cancel()  # killed before its writer stored anything
    proxy.writer.spool.write(calls)  # what `commit` appends before the agent's answer
    await proxy.writer.spool.close()
    await proxy.database.dispose()


async def test_a_spool_is_not_replayed_into_another_database(two_databases, tmp_path):
    first, second = two_databases
    settings = WriterSettings(spool_path=tmp_path / "spool.jsonl", durability="spool")
    calls = [record(uuid.uuid4().hex) for _ in range(3)]
    # The first proxy reached its database once (the spool then knows which it is), then spooled and died.
    proxy = Proxy(first, settings)
    await proxy.writer.start()
    stored = record(uuid.uuid4().hex)
    await proxy.writer.commit(stored)
    await proxy.writer.sync()
    assert orjson.loads((tmp_path / "spool.jsonl.database").read_bytes())["identity"]
    for call in calls:
        await proxy.writer.commit(call)
    proxy.writer._task.cancel()  # killed: the calls are in the spool only
    await proxy.database.dispose()
    proxy.writer.spool._lock_fd = None  # (a killed process releases its lock)

    elsewhere = Proxy(second, settings)
    with pytest.raises(SpoolForeign, match="not stored here") as refused:
        await elsewhere.writer.start()
    assert isinstance(refused.value, SpoolInUse)  # `rlproxy serve` prints it and exits, as for a spool in use
    await elsewhere.database.dispose()
    # Still on disk, for the operator to decide (with the stored call, whose segment was not full yet).
    assert spooled_ids(settings) == [c.id for c in [stored, *calls]]

    again = Proxy(first, settings)
    await again.writer.start()
    await again.writer.sync(timeout=15)
    assert await seqs_in_order(again.sessions, calls) == [1, 1, 1]
    await again.stop()
    assert not list(tmp_path.glob("spool.jsonl*"))  # a clean stop leaves nothing, the database's file included


async def test_a_spool_whose_database_never_answered_goes_by_its_address(two_databases, tmp_path):
    first, second = two_databases
    settings = WriterSettings(spool_path=tmp_path / "spool.jsonl", durability="spool")
    calls = [record(uuid.uuid4().hex) for _ in range(2)]
    await killed_with_calls_in_the_spool(first, settings, calls)
    assert orjson.loads((tmp_path / "spool.jsonl.database").read_bytes())["identity"] is None

    elsewhere = Proxy(second, settings)
    with pytest.raises(SpoolForeign, match="never reached"):
        await elsewhere.writer.start()
    await elsewhere.database.dispose()

    # The operator decides they belong to the second database after all: deleting the file hands them over.
    Path(tmp_path / "spool.jsonl.database").unlink()
    proxy = Proxy(second, settings)
    await proxy.writer.start()
    await proxy.writer.sync(timeout=15)
    assert await seqs_in_order(proxy.sessions, calls) == [1, 1]
    await proxy.stop()
