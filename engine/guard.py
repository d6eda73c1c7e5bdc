"""The engine's process-group guard: the engine never outlives the process that started it.

vLLM runs in its own process group (setsid), led by a small guard process (`GUARD_SCRIPT`, plain Python, no
imports of ours) whose child is vLLM. If the starter dies, even by SIGKILL, the kernel sends the guard SIGTERM
(Linux ``PR_SET_PDEATHSIG``, set by `set_parent_death_signal` between fork and exec; the guard also notices its
parent pid change), and the guard stops the whole group. The death signal fires when the *thread* that forked
the child ends, so children are always forked from one long-lived helper thread (`spawn`).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import subprocess
import sys
import threading

_PR_SET_PDEATHSIG = 1


# The engine's process group leader: a small guard that runs vLLM as its child and, when told to stop
# (SIGTERM) or when its supervisor is gone (PR_SET_PDEATHSIG, or its parent pid changing), stops the
# whole group: SIGTERM, then SIGKILL after the grace period. vLLM alone does not ensure this: a SIGTERM
# during its start-up leaves its engine-core process waiting on its worker. argv: grace, command...
GUARD_SCRIPT = r"""
import os, signal, subprocess, sys, time
grace = float(sys.argv[1])
parent, me, group = os.getppid(), os.getpid(), os.getpgrp()
stop = []
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda *_: stop.append(1))

def others():
    found = []
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not name.isdigit() or int(name) in (me, child.pid):
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as handle:
                rest = handle.read().decode(errors="replace").rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(rest) > 2 and rest[2] == str(group) and rest[0] != "Z":
            found.append(int(name))
    return found

def wait(busy, seconds):
    end = time.monotonic() + seconds
    while busy() and time.monotonic() < end:
        time.sleep(0.1)
    return not busy()

try:
    child = subprocess.Popen(sys.argv[2:])
    while child.poll() is None and not stop and os.getppid() == parent:
        time.sleep(0.2)
    if child.poll() is None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        os.killpg(group, signal.SIGTERM)
        wait(lambda: child.poll() is None, grace)
    clean = child.poll() is not None and wait(others, grace)
except BaseException:
    clean = False
if not clean:  # also ends this process; its output may have no reader left, so it says nothing
    os.killpg(group, signal.SIGKILL)
code = child.returncode
sys.exit(code if code >= 0 else 128 - code)
"""


def set_parent_death_signal(parent: int) -> None:
    """Runs in the child between fork and exec: get SIGTERM when `parent` dies (Linux)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except Exception:  # no prctl: the guard's parent-pid check still applies
            pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


_spawner: concurrent.futures.ThreadPoolExecutor | None = None
_spawner_lock = threading.Lock()


def spawn(*args, **kwargs) -> subprocess.Popen:
    """Popen from one helper thread that lives until interpreter exit (see the module docstring)."""
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-spawn")
        spawner = _spawner
    return spawner.submit(subprocess.Popen, *args, **kwargs).result()


def killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_members(pgid: int) -> list[tuple[int, str]]:
    """(pid, state) of the processes in group `pgid`, zombies included ("Z")."""
    if not os.path.isdir("/proc"):  # no procfs: only whether the group still exists is known
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [(pgid, "?")]
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read().decode(errors="replace")
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...", where comm may hold spaces and parentheses.
        rest = stat[stat.rfind(")") + 2 :].split()
        if len(rest) >= 3 and rest[2] == str(pgid):
            members.append((int(name), rest[0]))
    return members
