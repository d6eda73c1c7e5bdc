"""The JSON lines log of every attempt: a "started" line when its rollout exists and a "finished" line at its
end, so a crash between them still leaves the rollout id for `--resume` to ask the proxy about.

One run writes a log at a time: two runs appending to one log would run the same attempts twice on `--resume`
(each skips only what the log showed when it began), so the log is locked while a run holds it open."""
from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

from core.ids import is_valid_id
from runner.errors import RunInputError

Key = tuple[str, int, int]  # (task id, epoch, attempt)


def key_of(entry: dict[str, Any]) -> Key:
    epoch, attempt = entry["epoch"], entry["attempt"]
    if not all(type(number) is int for number in (epoch, attempt)):  # as written: 1e400 or "x" is no log line
        raise ValueError("epoch and attempt are whole numbers")
    rollout_id = entry.get("rollout_id")
    # the id is asked about with the runner's key (GET /rollouts/{id}): an edited "../metrics" must not become
    # another path of the proxy
    if rollout_id is not None and not (isinstance(rollout_id, str) and is_valid_id(rollout_id)):
        raise ValueError("not a rollout id")
    return (str(entry["task_id"]), epoch, attempt)


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # this user's only (0600): it holds rollout ids and the ends of agents' error output
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise RunInputError(f"--log {path}: {exc.strerror}") from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._fd)
            raise RunInputError(f"--log {path}: another run is writing this log; give each run its own --log") from None

    def write(self, event: str, **fields: Any) -> None:
        line = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "event": event, **fields}
        text = json.dumps(line, ensure_ascii=False, default=str) + "\n"
        # a lone surrogate (a task id of JSON "\ud800") is written as its JSON escape, which reads back as it was;
        # one write of the whole line, so a crash loses at most that line and leaves no half of it mid-file
        os.write(self._fd, text.encode("utf-8", "backslashreplace"))

    def close(self) -> None:
        os.close(self._fd)  # and with it the lock


def read_log(path: Path) -> dict[Key, list[dict[str, Any]]]:
    """Every logged line by attempt, oldest first; a torn last line (the crash) is ignored. A log that is not
    rlproxy run's (edited, another file given as --log) is RunInputError naming the line."""
    found: dict[Key, list[dict[str, Any]]] = {}
    try:
        with path.open(encoding="utf-8") as file:
            lines = file.readlines()
    except FileNotFoundError:
        return found
    except UnicodeDecodeError:
        raise RunInputError(f"{path}: not a log of rlproxy run (not UTF-8 text)") from None
    except OSError as exc:
        raise RunInputError(f"--log {path}: {exc.strerror}") from None
    for number, line in enumerate(lines, 1):
        try:
            entry = json.loads(line)
            found.setdefault(key_of(entry), []).append(entry)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            if number == len(lines):
                continue
            raise RunInputError(f"{path} line {number}: not a log line of rlproxy run") from None
    return found
