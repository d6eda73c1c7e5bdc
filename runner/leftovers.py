"""Processes agents leave running: none outlives `rlproxy run`.

Each attempt runs in a process group of its own, killed when the attempt ends (runner/agents.py). A process that
left the group (`setsid`, `setpgid`: a coding agent's shell tool often starts commands that way, and a model can
write `setsid server &`) escaped that kill, and once its parent exited it was adopted by init and ran on after the
run, on the machine that runs tasks. While the run lasts, `rlproxy run` is a child subreaper (Linux's
`PR_SET_CHILD_SUBREAPER`): such orphans are adopted by it instead, and when the run ends, however it ends, every
process the run started that is still below it is killed (processes that were below it before the run began, and
theirs, are left alone: `rlproxy run` may run inside another program). Not during the run: an orphan can be a
server an attempt still uses, and which attempt a process that left its group belongs to cannot be told.

Elsewhere than Linux nothing is adopted: what left its group still outlives the run there.
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("rlproxy.run")

PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
ROUNDS = 50  # a killed process's own children are adopted next: kill again until none is left (or give up)


@contextlib.contextmanager
def no_process_outlives_the_run() -> Iterator[None]:
    """While inside: orphans of agents' processes are adopted by this process; on leaving: all killed."""
    was = _subreaper()
    adopting = _set_subreaper(True)
    before = set(descendants(os.getpid())) if adopting else set()
    try:
        yield
    finally:
        if adopting:
            ended = end_descendants(keep=before)
            if ended:
                log.warning("ended %d process%s the agents left running (they had left their attempt's process "
                            "group)", ended, "" if ended == 1 else "es")
            _set_subreaper(was)


def _subreaper() -> bool:
    """Whether this process adopts orphans already (a program running `rlproxy run` in process may)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        flag = ctypes.c_int(0)
        return ctypes.CDLL(None, use_errno=True).prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 \
            and bool(flag.value)
    except (OSError, AttributeError):
        return False


def _set_subreaper(on: bool) -> bool:
    """Whether this process now adopts its descendants' orphans (False where the system cannot)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0 and on
    except (OSError, AttributeError):
        return False


def end_descendants(keep: set[int] = frozenset()) -> int:
    """SIGKILL every process below this one (then the children they had, adopted meanwhile); how many. They are
    not reaped here (asyncio reaps the attempts' own processes; a stray `waitpid` would take an exit it waits for):
    the zombies are gone when `rlproxy run` exits, a moment later."""
    ended: set[int] = set()
    for _ in range(ROUNDS):
        below = descendants(os.getpid(), keep)
        if not below:
            break
        for pid in below:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        ended.update(below)
        time.sleep(0.02)  # the killed processes' children are adopted meanwhile
    return len(ended)


def descendants(root: int, keep: set[int] = frozenset()) -> list[int]:
    """Every live (not zombie) process below `root`, read from /proc; none of `keep` or below them."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it ended meanwhile
            continue
        # after the command's last ")": state, ppid, ...
        state, ppid = stat[stat.rindex(")") + 2:].split(" ", 2)[:2]
        if state != "Z":
            children.setdefault(int(ppid), []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in keep:
                found.append(child)
                todo.append(child)
    return found

