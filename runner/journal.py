"""The JSON lines log of every attempt: a "started" line when its rollout exists and a "finished" line at its
end, so a crash between them still leaves the rollout id for `--resume` to ask the proxy about."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from runner.errors import RunInputError

Key = tuple[str, int, int]  # (task id, epoch, attempt)


def key_of(entry: dict[str, Any]) -> Key:
    return (str(entry["task_id"]), int(entry["epoch"]), int(entry["attempt"]))


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # a lone surrogate (a task id of JSON "\ud800") is written as its JSON escape, which reads back as it was
        # this user's only (0600): it holds rollout ids and the ends of agents' error output
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        self._file = os.fdopen(fd, "a", encoding="utf-8", errors="backslashreplace")

    def write(self, event: str, **fields: Any) -> None:
        line = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "event": event, **fields}
        self._file.write(json.dumps(line, ensure_ascii=False, default=str) + "\n")
        self._file.flush()  # a crash loses at most the line being written

    def close(self) -> None:
        self._file.close()


def read_log(path: Path) -> dict[Key, list[dict[str, Any]]]:
    """Every logged line by attempt, oldest first; a torn last line (the crash) is ignored."""
    found: dict[Key, list[dict[str, Any]]] = {}
    if not path.exists():
        return found
    with path.open(encoding="utf-8") as file:
        lines = file.readlines()
    for number, line in enumerate(lines, 1):
        try:
            entry = json.loads(line)
            found.setdefault(key_of(entry), []).append(entry)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            if number == len(lines):
                continue
            raise RunInputError(f"{path} line {number}: not a log line of rlproxy run") from None
    return found
