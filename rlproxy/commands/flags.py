"""Command-line flags made from settings models: one flag per field, its type, default and help taken from the
model, its environment variable `RLPROXY_<FLAG>`. A command names the models it is configured by; nothing
restates a default or a help string, so `--help`, the environment and docs/settings.md cannot disagree.

A model is a pydantic model (its fields' `description` is the help; nested models are flattened) or a
dataclass (`metadata["help"]`, as TrainConfig). A field's flag is its name with `-` for `_`, unless the field
says otherwise with `json_schema_extra={"flag": "name"}` (pydantic) or `metadata["flag"]` (dataclass).
Lists and tuples are repeatable flags that also take comma-separated values (`"split": False` keeps commas).
"""
from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

import click
from pydantic import BaseModel, SecretStr, ValidationError

ENV_PREFIX = "RLPROXY_"


def env_name(flag: str) -> str:
    """`--writer-queue-size` -> `RLPROXY_WRITER_QUEUE_SIZE` (the contract's rule for every flag)."""
    return ENV_PREFIX + flag.lstrip("-").upper().replace("-", "_")


@dataclasses.dataclass(frozen=True)
class Setting:
    """One field of a settings model as the command line sees it."""

    path: tuple[str, ...]  # where it sits in the model: ("writer", "queue_size")
    flag: str  # "writer-queue-size" (without dashes)
    kind: Any  # the field's type, Optional removed
    default: Any
    help: str
    split: bool = True  # a list's flag also takes comma-separated values

    @property
    def param(self) -> str:
        """The keyword argument the command receives: the field's path ("writer_queue_size", "upstreams")."""
        return "_".join(self.path)

    @property
    def many(self) -> bool:
        return typing.get_origin(self.kind) in (list, tuple)

    def option(self, default: Any = dataclasses.MISSING) -> Callable:
        """The click option; `default` replaces the model's (a command with defaults of its own, as the demo)."""
        default = self.default if default is dataclasses.MISSING else default
        kwargs: dict[str, Any] = dict(envvar=env_name(self.flag), show_envvar=True, help=self.help)
        if self.kind is bool:
            names = [f"--{self.flag}/--no-{self.flag}", self.param]
            return click.option(*names, default=bool(default), show_default=True, **kwargs)
        if self.many:
            shown = ",".join(map(str, default or ()))
            if len(shown) > 60:
                shown = f"{len(default)} built in"
            kwargs.update(multiple=True, default=tuple(default or ()), show_default=shown or False)
            item = (typing.get_args(self.kind) or (str,))[0]
            kwargs["type"] = _click_type(item)
        else:
            kwargs.update(default=_shown(default), show_default=default is not None, type=_click_type(self.kind))
        return click.option(f"--{self.flag}", self.param, **kwargs)

    def value(self, raw: Any) -> Any:
        """What the model is given for what click parsed (a list flag's values split at commas)."""
        if self.many:
            parts = [str(part).strip() for value in raw or () for part in
                     (str(value).split(",") if self.split else [value])]
            values = [part for part in parts if part]
            return tuple(values) if typing.get_origin(self.kind) is tuple else values
        if isinstance(raw, SecretStr):
            return raw.get_secret_value()
        return raw


def settings_of(model: type, prefix: tuple[str, ...] = ()) -> list[Setting]:
    """Every field of `model` (nested pydantic models flattened) as a Setting, in declaration order."""
    if isinstance(model, type) and issubclass(model, BaseModel):
        return _pydantic_settings(model, prefix)
    if dataclasses.is_dataclass(model):
        return _dataclass_settings(model, prefix)
    raise TypeError(f"{model!r} is neither a pydantic model nor a dataclass")


def _pydantic_settings(model: type[BaseModel], prefix: tuple[str, ...]) -> list[Setting]:
    hints = typing.get_type_hints(model)
    found = []
    for name, info in model.model_fields.items():
        kind = _without_none(hints[name])
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            found.extend(_pydantic_settings(kind, (*prefix, name)))
            continue
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        default = info.get_default(call_default_factory=True)
        if isinstance(default, SecretStr):
            default = default.get_secret_value()
        found.append(Setting((*prefix, name), str(extra.get("flag", name.replace("_", "-"))), kind, default,
                             info.description or "", bool(extra.get("split", True))))
    return found


def _dataclass_settings(model: type, prefix: tuple[str, ...]) -> list[Setting]:
    hints = typing.get_type_hints(model)
    found = []
    for field in dataclasses.fields(model):
        if field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:
            default = field.default
        found.append(Setting((*prefix, field.name), field.metadata.get("flag", field.name.replace("_", "-")),
                             _without_none(hints[field.name]), default, field.metadata.get("help", ""),
                             field.metadata.get("split", True)))
    return found


def _without_none(kind: Any) -> Any:
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        rest = [arg for arg in typing.get_args(kind) if arg is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return kind


def _click_type(kind: Any) -> Any:
    if typing.get_origin(kind) is Literal:
        return click.Choice([str(choice) for choice in typing.get_args(kind)])
    if kind is Path:
        return click.Path(path_type=Path)
    if kind in (int, float, str):
        return kind
    return str  # SecretStr and anything else the model itself parses from text


def _shown(default: Any) -> Any:
    return str(default) if isinstance(default, Path) else default


class Flags:
    """The flags of one command, from its settings models, and the models built back from what click parsed."""

    def __init__(self, *models: type, skip: Iterable[str] = (), defaults: dict[type, Any] | None = None) -> None:
        """`skip`: field paths ("writer.spool_path") or flags the command handles itself; `defaults`: per model,
        an instance whose values are this command's defaults instead of the model's."""
        skipped = set(skip)
        self.models = models
        self.defaults = defaults or {}
        self.settings: dict[type, list[Setting]] = {
            model: [s for s in settings_of(model) if ".".join(s.path) not in skipped and s.flag not in skipped]
            for model in models}
        for names in ([s.flag for group in self.settings.values() for s in group],
                      [s.param for group in self.settings.values() for s in group]):
            clashes = {name for name in names if names.count(name) > 1}
            if clashes:
                raise ValueError(f"two settings want the same flag or keyword: {sorted(clashes)}")

    def __call__(self, command: Callable) -> Callable:
        """Decorate a click command with every flag (in the models' order, first model first)."""
        for model, group in reversed(self.settings.items()):
            instance = self.defaults.get(model)
            for setting in reversed(group):
                default = _lookup(instance, setting.path) if instance is not None else dataclasses.MISSING
                command = setting.option(default)(command)
        return command

    def find(self, name: str) -> tuple[type, Setting]:
        """The setting a `--set NAME=VALUE` names: a field name or a flag."""
        for model, group in self.settings.items():
            for setting in group:
                if name.replace("-", "_") in (setting.path[-1], setting.param):
                    return model, setting
        raise click.BadParameter(f"{name!r} is not a setting of this command", param_hint="--set")

    def build(self, model: type, params: dict[str, Any], **fixed: Any) -> Any:
        """An instance of `model` from the command's keyword arguments (taken out of `params`), plus `fixed`
        values the command decided itself. A value the model refuses is a usage error naming the flag."""
        values: dict[str, Any] = {}
        for setting in self.settings[model]:
            if setting.param in params:
                _assign(values, setting.path, setting.value(params.pop(setting.param)))
        for name, value in fixed.items():
            _assign(values, tuple(name.split(".")), value)
        try:
            if issubclass(model, BaseModel):
                return model.model_validate(values)
            return model(**values)
        except (ValidationError, ValueError, TypeError) as exc:
            raise click.UsageError(f"invalid setting: {_readable(exc, self.settings[model])}") from None

    def apply_set(self, params: dict[str, Any], overrides: Iterable[str]) -> None:
        """`--set NAME=VALUE` pairs, each parsed by the flag's own click type, written over `params`."""
        for item in overrides:
            name, sep, raw = item.partition("=")
            if not sep:
                raise click.BadParameter(f"{item!r}: expected NAME=VALUE", param_hint="--set")
            _, setting = self.find(name.strip())
            if setting.many:
                params[setting.param] = (raw,)  # split at commas by `Setting.value`, as the flag's values are
                continue
            kind = click.BOOL if setting.kind is bool else click.types.convert_type(_click_type(setting.kind))
            try:
                params[setting.param] = kind.convert(raw.strip(), None, None)
            except click.BadParameter as exc:
                raise click.BadParameter(f"{name.strip()}: {exc.message}", param_hint="--set") from None

    def markdown(self, title: str) -> str:
        """The command's settings as a Markdown table: flag, environment variable, default, meaning."""
        lines = [f"### {title}", "", "| flag | environment | default | meaning |", "|---|---|---|---|"]
        for model, group in self.settings.items():
            instance = self.defaults.get(model)
            for setting in group:
                default = _lookup(instance, setting.path) if instance is not None else setting.default
                shown = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else default
                if isinstance(default, (list, tuple)) and len(str(shown)) > 60:
                    shown = f"{len(default)} built in"
                cell = "" if shown in (None, "") else f"`{shown}`"
                text = " ".join(setting.help.split()).replace("|", "\\|")
                lines.append(f"| `--{setting.flag}` | `{env_name(setting.flag)}` | {cell} | {text} |")
        return "\n".join(lines) + "\n"


def _lookup(instance: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        instance = getattr(instance, name)
    return instance.get_secret_value() if isinstance(instance, SecretStr) else instance


def _assign(values: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for name in path[:-1]:
        values = values.setdefault(name, {})
    values[path[-1]] = value


def _readable(exc: Exception, settings: list[Setting]) -> str:
    if not isinstance(exc, ValidationError):
        return str(exc)
    flags = {setting.path: setting.flag for setting in settings}
    parts = []
    for error in exc.errors():
        where = tuple(str(part) for part in error["loc"])
        flag = flags.get(where)
        parts.append(f"--{flag}: {error['msg']}" if flag else f"{'.'.join(where) or 'settings'}: {error['msg']}")
    return "; ".join(parts)
