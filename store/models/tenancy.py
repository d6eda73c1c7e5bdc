"""The tables of who may call: projects (tenants) and their bearer keys."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, Float, ForeignKey, Integer, String, text
from sqlalchemy.orm import Mapped, mapped_column

from store.models.base import Base, Timestamp, utcnow


class Project(Base):
    """A tenant: its keys' rollouts are invisible to every other project's keys."""

    __tablename__ = "projects"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)


class ApiKey(Base):
    """A bearer key of a project. Only the key's SHA-256 is stored (see `store.keys`)."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # public handle for listing and revoking
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    project: Mapped[str] = mapped_column(ForeignKey("projects.name", ondelete="CASCADE"), index=True)
    admin: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    label: Mapped[str | None] = mapped_column(String(256))
    rate_limit: Mapped[float | None] = mapped_column(Float)  # requests/s; None: the server's setting
    rate_burst: Mapped[int | None] = mapped_column(Integer)
    # A key made for evaluation (`rlproxy keys create --eval`): creates evaluation rollouts and gives their
    # final rewards, as an admin key does, without an admin key's other powers. Migration 0015.
    eval: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(Timestamp)
