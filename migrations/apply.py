"""Apply the Alembic migrations shipped in the `migrations` package; the only way the schema changes."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from alembic import command
from alembic.config import Config

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
