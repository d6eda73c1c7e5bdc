"""Apply the Alembic migrations shipped in the `migrations` package; the only way the schema changes."""
from __future__ import annotations

import asyncio
from pathlib import Path

from alembic import command
from alembic.config import Config

import migrations


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    config.set_main_option("sqlalchemy.url", database_url)
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    """Upgrade `database_url` to `revision` (blocking; run it in a thread from async code)."""
    command.upgrade(alembic_config(database_url), revision)


async def upgrade_async(database_url: str, revision: str = "head") -> None:
    await asyncio.to_thread(upgrade, database_url, revision)
