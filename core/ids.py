"""What a rollout, agent or task id may be: one rule for the proxy, which receives ids, and for the runner, which
sends them (a task id the proxy would refuse fails its attempt in the runner, before any rollout is opened)."""
from __future__ import annotations

import re

ID_LIMITS = {"rollout": 128, "agent": 128, "task": 256}  # characters
_ID = re.compile(r"[A-Za-z0-9._:@\-]+")  # safe in a URL path segment
# Task ids are free text (e.g. "gsm8k/train/17"). aiohttp reads header bytes that are not UTF-8 as lone surrogates
# (surrogateescape), which no JSON writer or database takes: refused here, with control characters.
_TEXT = re.compile(r"[^\x00-\x1f\x7f\ud800-\udfff]+")
_TEXT_REFUSED = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")


def is_valid_id(value: str, what: str = "rollout") -> bool:
    """Whether `value` is a rollout, agent or task id the proxy accepts (ids reach URL paths and Postgres text)."""
    if what != "task" and value in (".", ".."):  # a path segment every URL library resolves away
        return False
    pattern = _TEXT if what == "task" else _ID
    return len(value) <= ID_LIMITS[what] and pattern.fullmatch(value) is not None  # `$` would pass a final "\n"


def task_id_problem(value: str) -> str | None:
    """Why `value` cannot be a task id, in words (None when it can)."""
    if not value:
        return "the task id is empty"
    if len(value) > ID_LIMITS["task"]:
        return f"the task id is {len(value)} characters, more than a rollout's task id holds ({ID_LIMITS['task']})"
    refused = _TEXT_REFUSED.search(value)
    if refused is not None:
        return f"the task id holds a control character ({refused.group()!r}) at character {refused.start()}"
    return None
