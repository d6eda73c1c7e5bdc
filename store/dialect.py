"""The few statements that differ between Postgres and SQLite, and the database's clock."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import Table, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from store.models import as_utc, utcnow


def insert_ignoring_duplicates(session: AsyncSession, table: Table, index_elements: list[str] | None = None):
    """`INSERT … ON CONFLICT DO NOTHING`: replays of the same rows are no-ops (exactly-once writes).
    Without `index_elements` any unique index counts (needed for partial unique indexes)."""
    module = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    return module.insert(table).on_conflict_do_nothing(index_elements=index_elements)


def upsert(session: AsyncSession, table: Table, index_elements: list[str], values: dict, update: dict):
    """`INSERT … ON CONFLICT (index_elements) DO UPDATE SET update`: one statement, so concurrent writers of the
    same row never fail on the key (the last one's values stand)."""
    module = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    return module.insert(table).values(**values).on_conflict_do_update(index_elements=index_elements, set_=update)


async def database_now(session: AsyncSession) -> datetime:
    """The database's time (Postgres: its transaction's `now()`), for every time one process writes and another
    compares: a rollout's creation and finish, a lease's end, a tombstone, the cutoffs of expiry and retention.
    Each process's own clock would do only if every machine's agreed: a proxy 7 h behind the trainer had its new
    rollouts expired by the reward TTL at once. SQLite is a file on one machine, whose clock is the database's."""
    if session.get_bind().dialect.name == "postgresql":
        return as_utc((await session.execute(select(func.now()))).scalar_one())
    return utcnow()
