"""Alembic environment: runs migrations through the store's async connection pool for Postgres (asyncpg) and SQLite."""
from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection

from store.db import open_database
from store.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
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
