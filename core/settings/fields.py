"""What a command's settings model offers its users, field by field: a field's flag is its name with `-` for
`_`, its environment variable `RLPROXY_<FLAG>`, its default and its help (the field's `description`). A field
says more in `json_schema_extra`: "flag" (another name), "metavar", "split" and "text" (see Setting).
Nested models and pydantic dataclasses (the proxy's writer, the trainer's training settings) are flattened:
their fields are flags of the command like any other, and their defaults are those of the default instance
the command holds (the demo trains with defaults of its own; a group without a default instance keeps its
fields' own defaults, and a field without one is required). The field holding a group may say "prefix" (put
before each of its flags: the trainer's `prune-` before the pruning group's) and "was" (a field name -> the flag
it had before, still read as an alias, with its variable).

A secret (a SecretStr field, or one saying "secret": "value") is never taken on the command line, where every
process of the machine reads it (`/proc/PID/cmdline`): its variable gives it, or a file (`--FLAG-file PATH`,
`RLPROXY_<FLAG>_FILE`). A database URL (a field named `database_url`) may hold a password: it is refused there
only when it holds one (rlproxy/commands/flags.py).

A list or tuple field is a repeatable flag that also takes comma-separated values (`"split": False` keeps
commas: regular expressions); its environment variable separates values by spaces."""
from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable
from functools import cache
from typing import Any

from pydantic import BaseModel, SecretStr
from pydantic.dataclasses import is_pydantic_dataclass
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

ENV_PREFIX = "RLPROXY_"
SECRET = {"secret": "value"}  # json_schema_extra of a secret kept as text (a key with a default)
# The key a client is given where it needs one and none is set: OpenAI's and other clients refuse to start without
# a key, and a proxy with keys off reads none (one with keys on refuses it as any unknown key).
PLACEHOLDER_KEY = "rlproxy"


def env_name(flag: str, prefix: str = ENV_PREFIX) -> str:
    """`--writer-queue-size` -> `RLPROXY_WRITER_QUEUE_SIZE` (the one rule for every flag)."""
    return prefix + flag.lstrip("-").upper().replace("-", "_")


@dataclasses.dataclass(frozen=True)
class Setting:
    """One field of a command's settings model, as its flag, environment variable and documentation show it."""

    path: tuple[str, ...]  # where it sits in the model: ("writer", "queue_size")
    flag: str  # "writer-queue-size" (without dashes)
    kind: Any  # the field's type, Optional removed
    default: Any
    help: str
    split: bool = True  # a list's flag also takes comma-separated values
    metavar: str | None = None  # what --help shows for the value, when the type's name says too little
    text: bool = False  # the flag takes text the model itself parses (`v3` for a version number)
    was: tuple[str, ...] = ()  # flags it had before, still accepted (and their variables read)
    secret: str | None = None  # "value": never on a command line; "password": not with a password in it

    @property
    def file_flag(self) -> str:
        """The flag naming a file that holds a secret setting's value: `api-key-file`."""
        return self.flag + "-file"

    @property
    def file_env(self) -> str:
        return env_name(self.file_flag)

    @property
    def name(self) -> str:
        """The field's own name, as `--set NAME=VALUE` and `rlproxy train-config` call it."""
        return self.path[-1]

    @property
    def env(self) -> str:
        return env_name(self.flag)

    @property
    def envs(self) -> tuple[str, ...]:
        """Its variable, then those of the flags it had before (read when its own is unset)."""
        return (self.env, *(env_name(old) for old in self.was))

    @property
    def required(self) -> bool:
        return self.default is PydanticUndefined

    @property
    def many(self) -> bool:
        return typing.get_origin(self.kind) in (list, tuple)

    def values(self, given: Iterable[Any]) -> list[str]:
        """A repeatable setting's values from what was given (each flag, or the variable's words), split at
        commas unless the field keeps them."""
        parts = [part.strip() for value in given for part in (str(value).split(",") if self.split else [value])]
        return [part for part in parts if part]


@cache
def settings_of(model: type) -> tuple[Setting, ...]:
    """Every field of `model` (a pydantic model or dataclass; nested ones flattened), in declaration order.
    Two fields that want one flag are a mistake in the model, found here rather than by a user."""
    found = _settings(model, (), None, "", {})
    flags = [setting.flag for setting in found]
    if clashes := sorted({flag for flag in flags if flags.count(flag) > 1}):
        raise TypeError(f"{model.__name__}: two settings want the same flag: {clashes}")
    return tuple(found)


def nested(kind: Any) -> bool:
    """Whether a field of this type is a group of settings (flattened) rather than one setting."""
    return isinstance(kind, type) and (issubclass(kind, BaseModel) or is_pydantic_dataclass(kind))


def _settings(model: type, prefix: tuple[str, ...], instance: Any, flag_prefix: str,
              was: dict[str, str]) -> list[Setting]:
    found = []
    for name, info in _fields(model).items():
        kind = _without_none(info.annotation)
        default = getattr(instance, name) if instance is not None else info.get_default(call_default_factory=True)
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        if nested(kind):
            group = None if default is PydanticUndefined else default  # no instance: the fields' own defaults
            found.extend(_settings(kind, (*prefix, name), group, flag_prefix + str(extra.get("prefix", "")),
                                   dict(extra.get("was", {}))))
            continue
        if isinstance(default, SecretStr):
            default = default.get_secret_value()
        secret = "value" if kind is SecretStr else extra.get("secret") or (
            "password" if name.endswith("database_url") else None)
        found.append(Setting((*prefix, name), flag_prefix + str(extra.get("flag", name.replace("_", "-"))), kind,
                             default, info.description or "", bool(extra.get("split", True)), extra.get("metavar"),
                             bool(extra.get("text", False)), tuple(filter(None, [was.get(name)])), secret))
    return found


def _fields(model: type) -> dict[str, FieldInfo]:
    if is_pydantic_dataclass(model):
        return model.__pydantic_fields__
    return model.model_fields


def _without_none(kind: Any) -> Any:
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        rest = [arg for arg in typing.get_args(kind) if arg is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return kind
