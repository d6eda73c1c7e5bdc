"""Connecting to the store: one connection pool (SQLAlchemy's AsyncEngine) per process, with per-dialect settings.

Errors never carry a statement's parameters (`hide_parameters`): they hold what agents sent and keys' digests,
and an error's text reaches logs, the rejected-calls file and API answers. A SQLite database file is created
readable by its owner only (its -wal and -shm files take the same mode)."""
from __future__ import annotations

import contextlib
import os
import re
from collections.abc import AsyncIterator

import orjson
from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker,
                                    create_async_engine)


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


# U+0000 as orjson writes it: `\u0000` after an even number of backslashes (after an odd number the escape is text)
_NUL_ESCAPE = re.compile(rb"(?<!\\)((?:\\\\)*)\\u0000")


def _json_dumps(value) -> str:
    """A document as JSON every store can hold: Postgres' JSONB refuses U+0000, which agents do send (a tool's
    output with binary bytes) and models do write. Refused, the whole call would be set aside after its agent was
    answered; so it becomes U+FFFD, the replacement character, in documents only (token ids stay exact)."""
    data = orjson.dumps(value)
    if b"\\u0000" in data:
        data = _NUL_ESCAPE.sub(rb"\1\\ufffd", data)
    return data.decode()


JSON_CODEC = {"json_serializer": _json_dumps, "json_deserializer": orjson.loads}  # several times json's speed


def open_database(url: str, *, pool_size: int = 10) -> AsyncEngine:
    """The store's connection pool for `url` (SQLAlchemy calls it an AsyncEngine; here `database`, never `engine`,
    which in this project is the inference engine of engine/). SQLite gets WAL and a busy timeout so proxy and
    trainer can share a file."""
    if is_sqlite(url):
        _create_private(make_url(url).database)
        database = create_async_engine(url, connect_args={"timeout": 30}, hide_parameters=True, **JSON_CODEC)

        @event.listens_for(database.sync_engine, "connect")
        def _pragmas(dbapi_conn, _record):  # noqa: ANN001
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return database
    return create_async_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True,
                               hide_parameters=True, **JSON_CODEC)


def _create_private(path: str | None) -> None:
    """Create the SQLite file `path` with mode 0600 if it does not exist yet (SQLite would make it 0644 under the
    usual umask); a folder that does not exist is left for SQLite to report."""
    if not path or path == ":memory:" or path.startswith("file:"):
        return
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
    except FileNotFoundError:
        pass


def session_factory(database: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(database, expire_on_commit=False)


@contextlib.asynccontextmanager
async def short_session(url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    """Sessions on a one-connection pool of their own, disposed on leaving: for what touches the store
    rarely and briefly (a gate's verdict, `rlproxy eval`, a test's setup) rather than holding a pool open."""
    database = open_database(url, pool_size=1)
    try:
        yield session_factory(database)
    finally:
        await database.dispose()


async def ping(connection: AsyncSession | AsyncConnection) -> None:
    """The cheapest statement, for health checks: raises when the database does not answer."""
    await connection.execute(text("SELECT 1"))
