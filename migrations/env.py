"""Alembic environment: runs migrations through the store's async connection pool for Postgres (asyncpg) and SQLite."""
from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import text
from sqlalchemy.engine import Connection

from store.db import open_database
from store.models import Base

config = context.config
target_metadata = Base.metadata
MIGRATION_LOCK = 0x726C70726F7879  # "rlproxy": one advisory lock key for every process that migrates


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # Several proxies (and the trainer) migrate as they start: one at a time, each reading the version
            # only once the one before it has committed, so the second finds nothing left to do instead of
            # failing halfway through the same DDL.
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        context.run_migrations()


async def _run_async() -> None:
    database = open_database(config.get_main_option("sqlalchemy.url"))
    try:
        async with database.connect() as connection:
            await connection.run_sync(_run)
            await connection.commit()
    finally:
        await database.dispose()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata,
                      literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_run_async())
