"""Click flags made from a command's settings model (core/settings/): one flag per setting, with the type, the
default and the help the model gives it, and its `RLPROXY_<FLAG>` variable shown beside them. click reads no
variable: the command hands the flags given on its command line (and `--set NAME=VALUE` pairs, which win) to
the model, which reads the variables under them and the defaults under those (core/settings/base.py).

A secret (a key; a database URL holding a password) is refused on the command line, `--set` included: any process
of the machine reads a command line (`ps`, `/proc/PID/cmdline`), and a secret there is also in shell histories
and process accounting. It comes from its variable (`RLPROXY_API_KEY`) or a file (`--api-key-file PATH`, or
`RLPROXY_API_KEY_FILE`; the file's text without its final line break). Refused rather than wiped from argv:
the command line is readable from the moment the process starts, before any code of it could wipe it."""
from __future__ import annotations

import os
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

import click
from click.core import ParameterSource
from pydantic import ValidationError

from core.settings import CommandSettings, Setting
from core.settings.base import assign


class SettingOption(click.Option):
    """A flag whose `--help` names its environment variable, which the settings model reads (click does not)."""

    def __init__(self, *args: Any, variable: tuple[str, ...], required_setting: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.variable = variable
        self.required_setting = required_setting  # not click's `required`: the variable may give it

    def get_help_extra(self, ctx: click.Context) -> Any:
        extra = super().get_help_extra(ctx)
        extra["envvars"] = self.variable
        if self.required_setting:
            extra["required"] = "required"
        return extra


def param(setting: Setting) -> str:
    """The keyword argument the command receives for a setting: its flag with `_` ("writer_queue_size")."""
    return setting.flag.replace("-", "_")


def option(setting: Setting) -> Callable:
    """The click option of one setting."""
    shown = setting.help + (f" Not on the command line: {setting.env} or --{setting.file_flag}."
                            if setting.secret == "value" else "")
    kwargs: dict[str, Any] = dict(cls=SettingOption, variable=setting.envs, help=shown,
                                  required_setting=setting.required, metavar=setting.metavar)
    default = None if setting.required else setting.default
    names = [f"--{flag}" for flag in (setting.flag, *setting.was)]  # old names still work
    if setting.kind is bool:
        return click.option(*[f"{name}/--no-{name[2:]}" for name in names], param(setting), default=bool(default),
                            show_default=True, **kwargs)
    if setting.many:
        kwargs.update(multiple=True, default=tuple(default or ()), show_default=_shown_list(default) or False,
                      type=_click_type((typing.get_args(setting.kind) or (str,))[0]))
    else:
        kwargs.update(default=str(default) if isinstance(default, Path) else default,
                      show_default=default is not None, type=_value_type(setting))
    return click.option(*names, param(setting), **kwargs)


def _value_type(setting: Setting) -> Any:
    """What click parses a one-valued flag's value as (the model validates it then)."""
    return str if setting.text else _click_type(setting.kind)


def _click_type(kind: Any) -> Any:
    if typing.get_origin(kind) is Literal:
        return click.Choice([str(choice) for choice in typing.get_args(kind)])
    if kind is Path:
        return click.Path(path_type=Path)
    if kind in (int, float, str):
        return kind
    return str  # SecretStr and anything else the model itself parses from text


def _shown_list(default: Any) -> str:
    shown = ",".join(map(str, default or ()))
    return f"{len(default)} built in" if len(shown) > 60 else shown


class Flags:
    """The flags of one command, from its settings model, and the model built back from what was given."""

    def __init__(self, model: type[CommandSettings]) -> None:
        self.model = model
        self.settings = model.settings()

    def __call__(self, command: Callable) -> Callable:
        """Decorate a click command with every setting's flag, in the model's order."""
        for setting in reversed(self.settings):
            if self.own_file_flag(setting):
                command = file_option(setting)(command)
            command = option(setting)(command)
        return command

    def own_file_flag(self, setting: Setting) -> bool:
        """Whether a secret's `--X-file` flag is made here (not when the model has a setting of that name, which
        reads its file itself)."""
        return bool(setting.secret) and setting.file_flag not in {other.flag for other in self.settings}

    def secret_files(self, params: dict[str, Any]) -> dict[str, Path]:
        """The files the secrets were read from (`--api-key-file` -> its path), for a caller that checks who else
        may read them."""
        return {f"--{setting.file_flag}": path for setting in self.settings if self.own_file_flag(setting)
                if (path := file_named(setting, params)) is not None}

    def given(self, params: dict[str, Any], pairs: Iterable[str] = ()) -> dict[str, Any]:
        """What the command line gave, nested as the model is: the flags given (not their defaults), then
        the `--set NAME=VALUE` pairs over them."""
        context = click.get_current_context()
        given: dict[str, Any] = {}
        for setting in self.settings:
            if context.get_parameter_source(param(setting)) is ParameterSource.COMMANDLINE:
                raw = params[param(setting)]
                refuse_on_command_line(setting, raw, f"--{setting.flag}")
                assign(given, setting.path, setting.values(raw) if setting.many else raw)
            elif self.own_file_flag(setting):
                value = secret_from_file(setting, file_named(setting, params))
                if value is not None:
                    assign(given, setting.path, value)
        return self.pairs(pairs, given)

    def pairs(self, pairs: Iterable[str], given: dict[str, Any] | None = None) -> dict[str, Any]:
        """`--set NAME=VALUE` pairs, nested as the model is, written over `given`."""
        given = {} if given is None else given
        for pair in pairs:
            setting, value = self.pair(pair)
            refuse_on_command_line(setting, value, f"--set {setting.name}")
            assign(given, setting.path, value)
        return given

    def build(self, params: dict[str, Any], pairs: Iterable[str] = ()) -> Any:
        """The command's settings: flags and `--set` pairs given, over `RLPROXY_<FLAG>` variables, over the
        defaults. A value the model refuses is a usage error naming the flag (or the variable) it came from."""
        given = self.given(params, pairs)
        try:
            return self.model.from_command_line(given)
        except ValidationError as exc:
            raise click.UsageError(f"invalid setting: {self.readable(exc, given)}") from None

    def find(self, name: str) -> Setting:
        """The setting a `--set NAME=VALUE` names: its field name or its flag."""
        wanted = name.strip().replace("-", "_")
        for setting in self.settings:
            if wanted in (setting.name, param(setting)):
                return setting
        raise click.BadParameter(f"{name!r} is not a setting of this command", param_hint="--set")

    def pair(self, item: str) -> tuple[Setting, Any]:
        """A `--set NAME=VALUE` pair's setting and value, the value parsed as the setting's flag parses it."""
        name, sep, raw = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r}: expected NAME=VALUE", param_hint="--set")
        setting = self.find(name)
        if setting.many:
            return setting, setting.values([raw])
        kind = click.BOOL if setting.kind is bool else click.types.convert_type(_value_type(setting))
        try:
            return setting, kind.convert(raw.strip(), None, None)
        except click.BadParameter as exc:
            raise click.BadParameter(f"{name.strip()}: {exc.message}", param_hint="--set") from None

    def readable(self, exc: ValidationError, given: dict[str, Any]) -> str:
        by_path = {setting.path: setting for setting in self.settings}
        parts = []
        for error in exc.errors():
            where = tuple(str(part) for part in error["loc"])
            setting = by_path.get(where)
            if setting is None and error["type"] == "missing":  # a group none of whose flags was given
                setting = next((s for s in self.settings if s.path[:len(where)] == where and s.required), None)
            if setting is None:
                parts.append(f"{'.'.join(where) or 'settings'}: {error['msg']}")
                continue
            if error["type"] == "missing":
                parts.append(f"--{setting.flag} (or {setting.env}) is required")
                continue
            source = f"--{setting.flag}" if _has(given, where) else f"{setting.env} (--{setting.flag})"
            parts.append(f"{source}={error['input']!r}: {error['msg']}")
        return "; ".join(parts)

    def markdown(self, title: str) -> str:
        """The command's settings as a Markdown table: flag, environment variable, default, meaning."""
        lines = [f"### {title}", "", "| flag | environment | default | meaning |", "|---|---|---|---|"]
        for setting in self.settings:
            default = None if setting.required else setting.default
            shown = _shown_list(default) if isinstance(default, (list, tuple)) else default
            cell = "required" if setting.required else "" if shown in (None, "") else f"`{shown}`"
            text = " ".join(setting.help.split()).replace("|", "\\|")
            if setting.was:
                text += " Also read under its old name: " + ", ".join(
                    f"`--{old}`, `{env}`" for old, env in zip(setting.was, setting.envs[1:])) + "."
            if setting.secret:
                text += (" Not taken on the command line: the variable or a file (docs/security.md)." if
                         setting.secret == "value" else
                         " Not taken on the command line with a password in it: the variable, a file, or the "
                         "password in PGPASSWORD or ~/.pgpass (docs/security.md).")
            lines.append(f"| `--{setting.flag}` | `{setting.env}` | {cell} | {text} |")
            if self.own_file_flag(setting):
                lines.append(f"| `--{setting.file_flag}` | `{setting.file_env}` |  | A file holding "
                             f"`--{setting.flag}` (its text without the final line break). |")
        return "\n".join(lines) + "\n"


def file_param(setting: Setting) -> str:
    return param(setting) + "_file"


def file_option(setting: Setting) -> Callable:
    """`--api-key-file PATH` beside a secret's own flag (`RLPROXY_API_KEY_FILE` too)."""
    return click.option(f"--{setting.file_flag}", file_param(setting), cls=SettingOption, variable=(setting.file_env,),
                        type=click.Path(path_type=Path, dir_okay=False), default=None,
                        help=f"A file holding --{setting.flag} (its text without the final line break).")


def file_named(setting: Setting, params: dict[str, Any]) -> Path | None:
    """The file a secret's `--X-file` flag names, else its `RLPROXY_X_FILE` variable (click reads none)."""
    given = params.get(file_param(setting))
    return given if given is not None else Path(os.environ[setting.file_env]) if os.environ.get(setting.file_env) \
        else None


def holds_password(url: str) -> bool:
    """Whether a URL carries a password (`user:secret@host`, `?password=`)."""
    try:
        parts = urlsplit(url)
        return parts.password is not None or "password" in {name.lower() for name in parse_qs(parts.query)}
    except ValueError:  # not a URL: whatever it holds, the setting's own check refuses it
        return ":" in url.partition("@")[0] and "@" in url


def refuse_on_command_line(setting: Setting, value: Any, where: str) -> None:
    """A secret given on the command line: a usage error saying where to put it instead."""
    if setting.secret is None or value in (None, ""):
        return
    if setting.secret == "password":
        if not holds_password(str(value)):
            return
        raise click.UsageError(
            f"{where}: the URL holds a password, and a command line is readable by every process of this machine "
            f"(/proc/PID/cmdline); set {setting.env}, give --{setting.file_flag} FILE, or leave the password to "
            "PGPASSWORD or ~/.pgpass")
    raise click.UsageError(
        f"{where}: a secret is not taken on the command line, which every process of this machine can read "
        f"(/proc/PID/cmdline); set {setting.env} or give --{setting.file_flag} FILE")


def secret_from_file(setting: Setting, path: Path | None) -> str | None:
    """The value `--X-file` (or its variable) names, without its final line break; None when neither is given. The
    file and the variable of the value itself both given is a usage error: which one wins would be a guess."""
    if path is None:
        return None
    if any(os.environ.get(env) for env in setting.envs):
        raise click.UsageError(f"--{setting.file_flag} and {setting.env} both give --{setting.flag}: keep one")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise click.UsageError(f"--{setting.file_flag} {path}: {getattr(exc, 'strerror', None) or exc}") from None
    value = text.removesuffix("\n").removesuffix("\r")
    if not value or "\n" in value:
        raise click.UsageError(f"--{setting.file_flag} {path}: expected the value on one line, found "
                               f"{'nothing' if not value else 'several lines'}")
    return value


def _has(values: dict[str, Any], path: tuple[str, ...]) -> bool:
    for name in path:
        if not isinstance(values, dict) or name not in values:
            return False
        values = values[name]
    return True

