"""The base of every command's settings model (pydantic-settings): built by the command line from its flags,
then the `RLPROXY_<FLAG>` environment variables, then the defaults; built in code, from what it is given alone.

The second half matters: `rlproxy serve` builds the settings of the engine it starts, and the demo those of its
engine, proxy and trainer; `RLPROXY_PORT` (the proxy's port) must not move them."""
from __future__ import annotations

import os
from typing import Any, Self

from pydantic import BaseModel, ConfigDict
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from core.settings.fields import ENV_PREFIX, Setting, env_name, settings_of


class Part(BaseModel):
    """A group of settings inside a command's (the proxy's writer, its access control): flags of the command."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class CommandSettings(BaseSettings):
    """One command's settings; `settings()` lists them as its flags and docs/settings.md show them."""

    model_config = SettingsConfigDict(frozen=True, extra="forbid",
                                      # a group given in part (the demo's --seed) keeps the rest of the
                                      # command's own defaults for it, not the group's
                                      nested_model_default_partial_update=True)

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings],
                                   init_settings: PydanticBaseSettingsSource, env_settings: Any,
                                   dotenv_settings: Any, file_secret_settings: Any,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Flags over variables over defaults. The models name no prefix: only `from_command_line` gives one,
        # so that settings built in code read no variable. No .env file, no secrets folder.
        return init_settings, FlagVariables(settings_cls, env_settings.env_prefix)

    @classmethod
    def from_command_line(cls, given: dict[str, Any]) -> Self:
        """The settings a command runs with: `given` (its flags, nested as the model is) over the
        `RLPROXY_<FLAG>` environment variables over the defaults."""
        return cls(_env_prefix=ENV_PREFIX, **given)

    @classmethod
    def settings(cls) -> tuple[Setting, ...]:
        return settings_of(cls)


class FlagVariables(PydanticBaseSettingsSource):
    """Every setting's `RLPROXY_<FLAG>` variable, flattened as the flags are: `RLPROXY_WRITER_QUEUE_SIZE` is the
    writer's queue_size. An empty variable counts as unset; a repeatable setting's values are separated by
    spaces (and commas, as its flag's). Without a prefix (settings built in code) it reads nothing."""

    def __init__(self, settings_cls: type[BaseSettings], prefix: str) -> None:
        super().__init__(settings_cls)
        self.prefix = prefix

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ reads the flattened settings, not top-level fields

    def __call__(self) -> dict[str, Any]:
        if not self.prefix:
            return {}
        values: dict[str, Any] = {}
        for setting in settings_of(self.settings_cls):
            names = (setting.flag, *setting.was)  # a flag's variable, then those of its old names
            raw = next((value for name in names if (value := os.environ.get(env_name(name, self.prefix)))), None)
            if raw:
                assign(values, setting.path, setting.values(raw.split()) if setting.many else raw)
        return values


def assign(values: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    """values[path[0]][path[1]]... = value, making the groups on the way."""
    for name in path[:-1]:
        values = values.setdefault(name, {})
    values[path[-1]] = value
