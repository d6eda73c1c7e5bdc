"""Apply the Alembic migrations shipped in the `migrations` package; the only way the schema changes."""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from store.db import open_database

HERE = Path(__file__).resolve().parent  # this package: env.py and versions/


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(HERE))
    config.set_main_option("sqlalchemy.url", database_url)
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    """Upgrade `database_url` to `revision` (blocking)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        command.upgrade(alembic_config(database_url), revision)
        return
    # Inside an event loop: the migration environment runs a loop of its own, so it needs another thread.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(command.upgrade, alembic_config(database_url), revision).result()


async def upgrade_async(database_url: str, revision: str = "head") -> None:
    await asyncio.to_thread(upgrade, database_url, revision)


async def schema_problem(database_url: str) -> str | None:
    """Why `database_url`'s schema is not the one this rlproxy's code reads (never migrated, or at another
    revision), in words; None when it is. A command that only reads and writes rows (`rlproxy train`) says this
    in one line at its start, rather than failing at its first query with the database's own error."""
    head = ScriptDirectory.from_config(alembic_config(database_url)).get_current_head()
    database = open_database(database_url, pool_size=1)
    quiet = logging.getLogger("alembic.runtime.migration")  # "Context impl ...": lines about nothing done
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        async with database.connect() as connection:
            current = await connection.run_sync(lambda sync: MigrationContext.configure(sync).get_current_revision())
    finally:
        quiet.setLevel(level)
        await database.dispose()
    if current == head:
        return None
    if current is None:
        return "has no rlproxy schema yet: run `rlproxy migrate` with this --database-url first (`rlproxy serve` " \
               "migrates as it starts)"
    return f"has the schema of revision {current}, and this rlproxy reads {head}: run `rlproxy migrate` with this " \
           "--database-url (or run the rlproxy that migrated it)"
