"""A task's values as the programs of an attempt are given them: always as data, never where an option is parsed.

- Text for an environment variable (`--env-map`) or a prompt on standard input must be Unicode text (no lone
  surrogate, which no encoding can write) without a NUL (which ends a C string: the kernel refuses it in the
  environment). An environment variable holds at most `ENV_VALUE_MAX` bytes: Linux refuses a single string over
  128 KiB with "Argument list too long", and the environment and arguments together over about 2 MiB.
- The whole task is written to a file of the attempt's own (`RLPROXY_TASK_FILE`), whatever its size; it is in
  `RLPROXY_TASK` too when it fits.

A value that breaks these rules raises TaskDataError: that attempt fails with the reason, the run goes on."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from core.ids import task_id_problem
from runner.errors import AttemptError, TaskDataError

ENV_VALUE_MAX = 64 * 1024  # bytes of one environment variable's value
TASK_FILE = "task.json"


def as_text(value: Any) -> str:
    """A task value as text: a string as it is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def checked_text(value: Any, what: str) -> str:
    """The value as text fit for a program: Unicode without a NUL (`what` names it in the reason)."""
    text = as_text(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise TaskDataError(f"{what} is not Unicode text (a lone surrogate at character {exc.start})") from None
    if "\0" in text:
        raise TaskDataError(f"{what} holds a NUL character at character {text.index(chr(0))}: a program's "
                            "text cannot carry it")
    return text


def env_value(value: Any, variable: str, field: str) -> str:
    """A task field for the environment variable `variable` (`--env-map`)."""
    what = f"task field {field!r} (--env-map {variable}={field})"
    text = checked_text(value, what)
    size = len(text.encode("utf-8"))
    if size > ENV_VALUE_MAX:
        raise TaskDataError(f"{what} is {size / 1024:.0f} KiB, more than an environment variable carries "
                            f"({ENV_VALUE_MAX // 1024} KiB): read it from the file $RLPROXY_TASK_FILE")
    return text


def task_json(task: Any) -> str:
    """The whole task as JSON text (a NUL in it is written `\\u0000`, so only lone surrogates are refused). A NaN
    or infinite number (a Parquet row, a task dict in process) is refused: Python would write `NaN`, which is not
    JSON and which most agents' readers (JavaScript's, Go's, Rust's) refuse."""
    try:
        text = json.dumps(task, ensure_ascii=False, default=str, allow_nan=False)
    except ValueError:
        raise TaskDataError("the task holds a number JSON cannot write (NaN or infinity)") from None
    return checked_text(text, "the task")


def task_variables(task: Any, folder: Path) -> dict[str, str]:
    """Writes the task to `folder` (the attempt's own, readable by this user only) and returns the variables
    naming it: `RLPROXY_TASK_FILE` always, `RLPROXY_TASK` (the JSON itself) when it fits the environment."""
    text = task_json(task)
    path = folder / TASK_FILE
    # created here and now, this user's only from the start; never through a link a program of the attempt left
    # in the folder (a harness's folder holds its working folder), so the runner writes nowhere else
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise AttemptError(f"cannot write the task to {path}: {exc.strerror} (a program of the attempt put a file "
                           "there)") from None
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(text)
    found = {"RLPROXY_TASK_FILE": str(path)}
    if len(text.encode("utf-8")) <= ENV_VALUE_MAX:
        found["RLPROXY_TASK"] = text
    return found


def task_id(value: str) -> str:
    """A task id fit for a rollout: what the proxy takes (core/ids.py), else TaskDataError saying why."""
    text = checked_text(value, "the task id")
    problem = task_id_problem(text)
    if problem is not None:
        raise TaskDataError(problem)
    return text
