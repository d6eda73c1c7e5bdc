"""What every table of the schema is built on: the declarative base and its naming convention (so that Alembic
names constraints the same way on every database), the column types that differ between Postgres and SQLite
(typed arrays and JSONB on Postgres, JSON on SQLite), and the one clock rows are stamped with (UTC)."""
from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import JSON, REAL, DateTime, Integer
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import DeclarativeBase

IntArray = JSON().with_variant(ARRAY(Integer), "postgresql")
FloatArray = JSON().with_variant(ARRAY(REAL), "postgresql")
Document = JSON().with_variant(JSONB(), "postgresql")
Timestamp = DateTime(timezone=True)

# Naming convention so Alembic migrations name constraints the same way on every database.
NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def as_utc(moment: datetime) -> datetime:
    """A time read back from the database, with its zone: SQLite keeps none (every time stored is UTC)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


class Base(DeclarativeBase):
    pass


Base.metadata.naming_convention = NAMING
