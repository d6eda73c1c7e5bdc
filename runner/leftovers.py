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

When the runner itself dies (SIGKILL, the OOM killer: nothing of its own runs), its agents are ended by:
- `PR_SET_PDEATHSIG` (SIGKILL), set in each program it starts before the program runs (`preexec`): a direct child
  dies with the runner;
- the watchdog (runner/watchdog.py), a process of its own session started with the run: it is told each attempt's
  process group, and kills those left once its pipe from the runner closes without the runner's `exit`;
- a cgroup v2 of the run's own, where the system lets the runner make one below its own (root, or a delegated
  cgroup): every agent program is put into it before it runs, and the watchdog kills all that is in it, processes
  that left their group included. Where there is none, a process that left its group outlives a killed runner.
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from runner.identity import AgentUser

log = logging.getLogger("rlproxy.run")

PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
ROUNDS = 50  # a killed process's own children are adopted next: kill again until none is left (or give up)


PR_SET_PDEATHSIG = 1
CGROUP_NAME = "rlproxy-run-"
PROJECT_ROOT = Path(__file__).resolve().parent.parent
_watchdog: subprocess.Popen | None = None  # the running run's (one at a time per process)
_cgroup: Path | None = None
_before: set[int] = set()  # the processes below this one when the run began (not the run's: never ended by it)
_groups: set[int] = set()  # the process groups of the programs the run is running now (runner/agents.py)
# every attempt's programs carry their rollout's token in their environment (store/rollout_tokens.py's
# ROLLOUT_TOKEN_PREFIX; the runner imports core alone, and tests/test_run_verify_leftovers.py uses tokens alike)
TOKEN = b"rlr_"


@contextlib.contextmanager
def no_process_outlives_the_run() -> Iterator[None]:
    """While inside: orphans of agents' processes are adopted by this process, and a watchdog (with the run's
    cgroup, where there can be one) ends them if this process dies; on leaving: all killed."""
    global _watchdog, _cgroup, _before
    was = _subreaper()
    adopting = _set_subreaper(True)
    before = set(descendants(os.getpid())) if adopting else set()
    _before = before
    _cgroup = make_cgroup() if sys.platform.startswith("linux") else None
    _watchdog = start_watchdog(_cgroup)
    try:
        yield
    finally:
        watchdog, cgroup, _watchdog, _cgroup = _watchdog, _cgroup, None, None
        if adopting:
            ended = end_descendants(keep=before | ({watchdog.pid} if watchdog is not None else set()))
            if ended:
                log.warning("ended %d process%s the agents left running (they had left their attempt's process "
                            "group)", ended, "" if ended == 1 else "es")
            _set_subreaper(was)
        if watchdog is not None:  # it ends what is left in the cgroup (what left this tree too) and removes it
            _tell(watchdog, "exit")
            with contextlib.suppress(OSError):
                watchdog.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                watchdog.wait(10)
        elif cgroup is not None:
            with contextlib.suppress(OSError):
                cgroup.rmdir()


def start_watchdog(cgroup: Path | None) -> subprocess.Popen | None:
    """runner/watchdog.py in a session of its own (a signal to the runner's group does not reach it), with none
    of the runner's variables; None where it cannot start (the run goes on, as it did without one)."""
    try:
        process = subprocess.Popen([sys.executable, "-m", "runner.watchdog"], stdin=subprocess.PIPE,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                   cwd=PROJECT_ROOT, text=True,
                                   env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(PROJECT_ROOT)})
    except OSError as exc:
        log.warning("no watchdog for this run (%s): a killed rlproxy run may leave agents' processes", exc)
        return None
    if cgroup is not None:
        _tell(process, f"cgroup {cgroup}")
    return process


def _tell(process: subprocess.Popen, line: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        process.stdin.write(line + "\n")
        process.stdin.flush()


def watch_group(group: int, began: bool) -> None:
    """An attempt's process group began (the watchdog ends it if the runner dies) or was ended by the runner."""
    (_groups.add if began else _groups.discard)(group)
    if _watchdog is not None:
        _tell(_watchdog, f"{'+' if began else '-'}{group}")


def make_cgroup() -> Path | None:
    """A cgroup v2 folder of the run's own below this process's, where the system lets it make one."""
    try:
        own = next(line[3:].strip() for line in Path("/proc/self/cgroup").read_text().splitlines()
                   if line.startswith("0::"))
        mount = next(line.split(" - ")[0].split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
                     if " - cgroup2 " in line)
        folder = Path(mount) / own.lstrip("/") / f"{CGROUP_NAME}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        folder.mkdir(mode=0o755)
    except (OSError, StopIteration, IndexError):
        return None
    return folder


def preexec(user: AgentUser | None = None) -> Callable[[], None]:
    """What each agent program runs before its own code (`preexec_fn`): in the run's cgroup, as `user` (if one:
    --agent-user), killed when this process dies. If this process died meanwhile, the program ends at once."""
    parent, cgroup = os.getpid(), _cgroup
    procs = str(cgroup / "cgroup.procs") if cgroup is not None else None

    def before_exec() -> None:
        if procs is not None:
            with contextlib.suppress(OSError):
                fd = os.open(procs, os.O_WRONLY)
                try:
                    os.write(fd, b"0")
                finally:
                    os.close(fd)
        if user is not None:  # before the death signal: a change of user clears it
            user.become()
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the runner died before the signal was set
            os._exit(137)

    return before_exec


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


def end_leftovers_of(marker: str, folder: Path | None = None) -> int:
    """SIGKILL what an attempt left running once its program ended, before its verifier reads the folder: the
    processes below this one whose environment holds `marker` (the attempt's own token, in every variable set its
    programs were given) or whose working folder is inside `folder` (the attempt's), and everything below them; how
    many. What left the attempt's process group (`setsid cmd &`) would otherwise go on changing the folder while
    the verifier reads it, and a reward could come from that, not from what the agent did by the time it ended.
    Only below this process (the subreaper adopts them): nothing a run did not start."""
    needle = marker.encode()
    ended: set[int] = set()
    keep = _before | ({_watchdog.pid} if _watchdog is not None else set())
    for _ in range(ROUNDS):
        theirs = [pid for pid in descendants(os.getpid(), keep) if _holds(pid, needle, folder)]
        if not theirs:
            break
        for pid in theirs + [below for pid in theirs for below in descendants(pid)]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            ended.add(pid)
        time.sleep(0.02)
    return len(ended)


def _holds(pid: int, needle: bytes, folder: Path | None) -> bool:
    """Whether the process is the attempt's: its token in its environment, its working folder in the attempt's,
    or, outside every program the run is running now, no attempt's token at all (one that cleared its environment
    and left the folder, `cd / && env -i setsid ...`, is no other attempt's either: nothing can own it)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        if (needle and needle in environ) or (TOKEN not in environ and os.getpgid(pid) not in _groups):
            return True
        return folder is not None and Path(os.readlink(f"/proc/{pid}/cwd")).is_relative_to(folder)
    except OSError:  # ended meanwhile, or not ours to read
        return False


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

