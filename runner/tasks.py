"""Reading the task set: JSON lines (errors name the line), or a Parquet file / `datasets` folder when the
`datasets` package is installed. Each task gets a stable id and a split (train or eval)."""
from __future__ import annotations

import hashlib
import json
import math
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from core.checks import nests_deeper_than
from runner.errors import RunInputError

TRAIN, EVAL = "train", "eval"


@dataclass(frozen=True)
class Task:
    id: str  # the rollout's task id: the trainer compares the attempts of one id as a group
    data: Any  # what the agent is given: an object of the task file (in process, whatever the agent takes)
    split: str = TRAIN  # TRAIN or EVAL (an evaluation rollout, never trained on)
    where: str = ""  # "tasks.jsonl line 3", for errors about this task


def canonical_id(task: dict[str, Any]) -> str:
    """A hash of the task's canonical JSON (sorted keys, no spaces): the same task has the same id in every
    run, so a resumed run finds its attempts."""
    text = json.dumps(task, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    # surrogatepass: a task holding a lone surrogate still has an id; its attempts fail with the reason
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def held_out(task_id: str, share: float) -> bool:
    """Whether a task falls in the evaluation share: by its id, so the split is the same in every run."""
    return int(hashlib.sha256(task_id.encode("utf-8", "surrogatepass")).hexdigest()[:8], 16) / 2**32 < share


MAX_TASK_DEPTH = 64  # as the proxy reads a body (proxy/strict_json.py): every task is written again as JSON
# Characters of one line of a task file at most: a task is held in memory and handed to every attempt, and a file
# that never ends a line (`--tasks /dev/zero`) would otherwise be read until memory runs out.
MAX_LINE = 64 * 1024 * 1024


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e400: Python reads it as infinity, which no JSON writer can hand on
        raise ValueError(f"{text[:40]} is too large for a double")
    return value


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    task: dict[str, Any] = {}
    for key, value in pairs:
        if key in task:  # which value the agent would see depends on its reader: refused, as the proxy does
            raise ValueError(f"the key {key!r} appears twice in one object")
        task[key] = value
    return task


def parse_task_line(line: str) -> Any:
    """One line as strict JSON: what the agent is handed must be JSON every reader takes the same way (no NaN,
    Infinity, number past a double, or key given twice). Raises ValueError saying why."""
    return json.loads(line, parse_constant=_refuse_constant, parse_float=_finite, object_pairs_hook=_no_repeats)


def _lines(file: TextIO, where: str) -> Iterator[tuple[int, str]]:
    number = 0
    while line := file.readline(MAX_LINE + 1):
        number += 1
        if len(line) > MAX_LINE:
            raise RunInputError(f"{where} line {number}: longer than {MAX_LINE:,} characters; a task file has one "
                                "JSON object a line")
        yield number, line


def _json_lines(path: Path) -> list[tuple[str, dict[str, Any]]]:
    rows = []
    try:
        # utf-8-sig: a byte order mark (files saved on Windows) is not part of the first task
        with path.open(encoding="utf-8-sig") as file:
            for number, line in _lines(file, str(path)):
                if not line.strip():
                    continue
                where = f"{path} line {number}"
                try:
                    task = parse_task_line(line)
                except json.JSONDecodeError as exc:
                    hint = " (not one JSON array)" if number == 1 and line.lstrip().startswith("[") else ""
                    raise RunInputError(f"{where}: not JSON ({exc.msg}); a task file has one JSON object a "
                                        f"line{hint}") from None
                except RecursionError:
                    task = None  # nested past what Python reads: refused below like any line too deep
                except ValueError as exc:  # a number JSON cannot hand on, a key twice, an integer of 4,300 digits
                    raise RunInputError(f"{where}: not JSON every reader takes ({exc})") from None
                if task is None or nests_deeper_than(task, MAX_TASK_DEPTH):
                    raise RunInputError(f"{where}: nests arrays and objects more than {MAX_TASK_DEPTH} levels "
                                        "deep (it could not be handed to an agent as JSON)")
                if not isinstance(task, dict):
                    raise RunInputError(f"{where}: a task is a JSON object, not {type(task).__name__}")
                rows.append((where, task))
    except UnicodeDecodeError as exc:
        raise RunInputError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise RunInputError(f"{path}: {exc.strerror}") from None
    return rows


def _dataset(path: Path) -> list[tuple[str, dict[str, Any]]]:
    try:
        import datasets
    except ImportError:
        raise RunInputError(f"{path}: reading a Parquet file or a datasets folder needs the datasets package "
                            "(pip install datasets); or give JSON lines") from None
    # read into memory, with datasets' cache in a folder of its own that goes with the read (no copy of the
    # task set is left in the user's cache)
    with tempfile.TemporaryDirectory(prefix="rlproxy-tasks-") as cache:
        try:
            data = (datasets.Dataset.from_parquet(str(path), cache_dir=cache, keep_in_memory=True) if path.is_file()
                    else datasets.load_from_disk(str(path), keep_in_memory=True))
        except Exception as exc:  # noqa: BLE001 — whatever datasets raises, said in one line
            raise RunInputError(f"{path}: {exc}") from None
        if isinstance(data, datasets.DatasetDict):
            if len(data) != 1:
                raise RunInputError(f"{path}: holds the splits {sorted(data)}; give one split's folder")
            data = next(iter(data.values()))
        return [(f"{path} row {index}", dict(row)) for index, row in enumerate(data)]


def read_tasks(path: Path, split: str, id_field: str | None = None, needed: dict[str, str] | None = None,
               eval_share: float = 0.0) -> list[Task]:
    """The tasks of one file. `needed`: the fields every task must have, each with the flag that names it."""
    if not path.exists():
        raise RunInputError(f"{path}: no such file")
    rows = _dataset(path) if path.is_dir() or path.suffix == ".parquet" else _json_lines(path)
    if not rows:
        raise RunInputError(f"{path}: no tasks")
    tasks, seen = [], {}
    for where, data in rows:
        for field, named_by in (needed or {}).items():
            if field not in data:
                raise RunInputError(f"{where}: no field {field!r} (named by {named_by})")
        task = make_task(data, where, split, id_field, eval_share)
        if task.id in seen:
            raise RunInputError(f"{where}: task id {task.id!r} repeats {seen[task.id]}")
        seen[task.id] = where
        tasks.append(task)
    return tasks


def make_task(data: dict[str, Any], where: str, split: str = TRAIN, id_field: str | None = None,
              eval_share: float = 0.0) -> Task:
    """One task object with its id (the `id_field`, else a hash of it) and its split (EVAL when asked for, or
    when its id falls in the evaluation share)."""
    if id_field is not None:
        value = data.get(id_field)
        if value is None or value == "":
            raise RunInputError(f"{where}: no field {id_field!r} (named by --task-id-field)")
        # text or a whole number, as it is written: True would become "True", 1.5 "1.5", a list Python's repr
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise RunInputError(f"{where}: field {id_field!r} (named by --task-id-field) is {type(value).__name__}, "
                                "not text or a whole number")
        task_id = str(value)
    else:
        task_id = canonical_id(data)
    chosen = EVAL if split == EVAL or (eval_share > 0 and held_out(task_id, eval_share)) else TRAIN
    return Task(task_id, data, chosen, where)


def env_map(pairs: tuple[str, ...]) -> dict[str, str]:
    """`--env-map VAR=field` pairs as {VAR: field}."""
    mapped = {}
    for pair in pairs:
        variable, sep, field = pair.partition("=")
        if not sep or not variable.strip() or not field.strip():
            raise RunInputError(f"--env-map {pair!r}: expected VAR=field")
        if variable.strip() in mapped:  # the later one would silently win
            raise RunInputError(f"--env-map {variable.strip()}: named twice")
        mapped[variable.strip()] = field.strip()
    return mapped
