"""The few statements that differ between Postgres and SQLite."""
from __future__ import annotations

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession


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
