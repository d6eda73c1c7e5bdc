"""What the recording tests share: calls to record (`record`), ways to look at what the real Postgres stored
(`count`, `call_count`, `seqs_in_order`) and what the spool holds (`spooled_ids`), and the fixtures: `sessions`
(a session factory on the test database) and `link` (a TCP link to the database that a test can cut)."""
from __future__ import annotations

import asyncio
import uuid

import orjson
import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from core.settings import WriterSettings
from store.db import open_database, session_factory
from store.models import Call, Rollout, utcnow
from store.records import CallRecord, ChoiceRecord
from tests.support import pump


class CuttableLink:
    """A TCP forwarder to the database that can be cut (connections reset, new ones refused) and restored."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.server: asyncio.Server | None = None
        self.port: int | None = None
        self.pipes: set[asyncio.StreamWriter] = set()

    async def open(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port or 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        self.server.close()
        await self.server.wait_closed()
        for writer in list(self.pipes):
            writer.transport.abort()

    async def _serve(self, reader, writer) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.pipes |= {writer, up_writer}
        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))


def record(rollout_id: str) -> CallRecord:
    return CallRecord(id=uuid.uuid4().hex, route="chat", started_at=utcnow(), rollout_id=rollout_id,
                      prompt_token_ids=[1, 2, 3], choices=[ChoiceRecord(0, [4, 5], [-0.1, -0.2], "stop")])


async def count(sessions, rollout_id: str) -> int:
    async with sessions() as session:
        return (await session.execute(select(func.count()).where(Call.rollout_id == rollout_id))).scalar_one()


@pytest.fixture
async def link(database_url):
    url = make_url(database_url)
    link = CuttableLink(url.host, url.port or 5432)
    await link.open()
    yield link, url.set(host="127.0.0.1", port=link.port).render_as_string(hide_password=False)
    if link.server.is_serving():
        await link.cut()


async def seqs_in_order(sessions, records) -> list[int]:
    async with sessions() as session:
        rows = dict((await session.execute(select(Call.id, Call.seq).where(
            Call.id.in_([r.id for r in records])))).all())
    return [rows.get(r.id) for r in records]


@pytest.fixture
async def sessions(database_url):
    database = open_database(database_url)
    yield session_factory(database)
    await database.dispose()


def spooled_ids(settings: WriterSettings) -> list[str]:
    """The call ids in the spool's segments, oldest first, one per line."""
    segments = sorted(settings.spool_path.parent.glob(settings.spool_path.name + "*"),
                      key=lambda p: int(p.name.rsplit(".", 1)[1]) if p.name[-1].isdigit() else 0)
    return [orjson.loads(line)["id"] for p in segments if not p.name.endswith((".lock", ".rejected.jsonl", ".database"))
            for line in p.read_bytes().splitlines()]


async def call_count(sessions, rollout_id: str) -> int:
    async with sessions() as session:
        return (await session.execute(select(Rollout.call_count).where(Rollout.id == rollout_id))).scalar_one()
