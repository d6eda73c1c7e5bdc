"""The store's maintenance commands: `rlproxy migrate`, `rlproxy keys create|list|revoke`, `rlproxy export` and
`rlproxy model prepare`; each one's flags come from its model here, as every command's do."""
from __future__ import annotations

from pathlib import Path

from pydantic import Field

from core.settings.base import CommandSettings
from core.settings.locations import DEFAULT_DATABASE_URL


class StoreCommandSettings(CommandSettings):
    database_url: str = Field(DEFAULT_DATABASE_URL, description="SQLAlchemy async database URL.")


class MigrateSettings(StoreCommandSettings):
    pass


class KeysCreateSettings(StoreCommandSettings):
    project: str = Field(description="Project the key belongs to (created if new).")
    admin: bool = Field(False, description="Also allow admin routes (activating its project's own policies, metrics).")
    eval: bool = Field(False, description="A key made for evaluation: it creates evaluation rollouts and gives "
                                          "their final rewards (the evidence /policies and the gates report), "
                                          "without an admin key's other rights.")
    label: str | None = Field(None, description="A note shown by `keys list`.")
    rate_limit: float | None = Field(None, description="Requests per second for this key (default: the server's).")
    rate_burst: int | None = Field(None, description="Burst for this key (default: the server's).")


class KeysListSettings(StoreCommandSettings):
    project: str | None = Field(None, description="Only this project's keys.")


class KeysRevokeSettings(StoreCommandSettings):
    pass


class ExportSettings(StoreCommandSettings):
    out: Path = Field(description="JSON-lines file to write.")
    untrained_only: bool = Field(False, description="Only rollouts the trainer has not consumed yet.")


class ModelPrepareSettings(CommandSettings):
    out: Path | None = Field(None, description="Folder to write (default: the cache).")
