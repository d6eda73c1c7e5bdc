"""The watchdog of one `rlproxy run`: a small process of its own session that ends the run's agents when the runner
dies, however it dies (SIGKILL and the OOM killer included, which no handler of the runner's sees).

The runner holds the write end of the watchdog's standard input and tells it, one line each, what to end:
`cgroup PATH` (the run's cgroup v2 folder, where the system lets the runner make one), `+PGID` / `-PGID` (an
attempt's process group began / was ended by the runner) and `exit` (the run ended and cleaned up itself). Its
input ending without `exit` means the runner is gone: every group it was told of is killed, and every process of
the cgroup (those that left their group with `setsid` too), then it exits. Started by runner/leftovers.py as
`python -m runner.watchdog`, with no variable of the runner's (its keys stay in the runner)."""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

ROUNDS = 100  # kills of the cgroup's processes (their children may fork meanwhile), 20 ms apart


def end_cgroup(folder: Path) -> None:
    """Every process of the cgroup killed (`cgroup.kill` where the kernel has it, else one by one), the folder
    removed once empty."""
    kill = folder / "cgroup.kill"
    for _ in range(ROUNDS):
        try:
            pids = [int(line) for line in (folder / "cgroup.procs").read_text().split()]
        except OSError:
            return  # gone already
        if not pids:
            break
        if kill.exists():
            with contextlib.suppress(OSError):
                kill.write_text("1")
        else:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
    for _ in range(ROUNDS):  # a killed process leaves its cgroup a moment after
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)


def end_groups(groups: set[int]) -> None:
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)


def watch(lines) -> bool:
    """Follows the runner's lines to their end; True when the runner said `exit` (nothing to end)."""
    groups: set[int] = set()
    cgroup: Path | None = None
    for line in lines:
        word = line.strip()
        if word == "exit":
            if cgroup is not None:
                end_cgroup(cgroup)
            return True
        if word.startswith("cgroup "):
            cgroup = Path(word.removeprefix("cgroup "))
        elif word[:1] in "+-" and word[1:].isdigit():
            (groups.add if word[0] == "+" else groups.discard)(int(word[1:]))
    end_groups(groups)
    if cgroup is not None:
        end_cgroup(cgroup)
    end_groups(groups)  # a process of a group that forked while the cgroup was ended
    return False


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the runner, which then says `exit`
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a closed terminal too: the watchdog outlives its runner
    watch(sys.stdin)


if __name__ == "__main__":
    main()
