"""An `rlproxy run` killed with SIGKILL (nothing of its own runs: no handler, no `finally`) leaves none of its
agents' processes behind: the agent's shell dies with it (PR_SET_PDEATHSIG), the shell's child in the attempt's
process group and a process that left the group with `setsid` are ended by the run's watchdog (with the run's
cgroup v2 where the system lets it make one). Real processes: the proxy, the runner, the agent and its children."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from testkit.processes import rlproxy_command

BOUND_S = 10.0  # how long the last of them may take to go


def alive(pid: int) -> bool:
    """Running (a zombie waiting for a parent that does not reap it counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def wait_for(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_a_sigkilled_runner_leaves_no_agent_process(proxy_url, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "stays"}) + "\n")
    pids = tmp_path / "pids"
    # the shell (a direct child), a child in its group, one in a session of its own; each writes its pid
    agent = (f"echo $$ >> {pids}; sleep 300 & echo $! >> {pids}; "
             f"setsid sh -c 'echo $$ >> {pids}; exec sleep 300' </dev/null >/dev/null 2>&1 & wait")
    runner = subprocess.Popen(rlproxy_command("run", "--proxy", proxy_url, "--tasks", str(tasks), "--attempts", "1",
                                              "--log", str(tmp_path / "run.jsonl"), "--command", agent,
                                              "--timeout", "600"),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        assert wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 3, 60), \
            runner.stderr.read1().decode() if runner.poll() is not None else "the agent did not start"
        started = [int(pid) for pid in pids.read_text().split()]
        watchdogs = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
                     if alive(pid) and b"runner.watchdog" in Path(f"/proc/{pid}/cmdline").read_bytes()
                     and _started_by(pid, runner.pid)]
        assert all(alive(pid) for pid in started)
        killed_at = time.monotonic()
        os.kill(runner.pid, signal.SIGKILL)  # the runner alone, not its group: nothing else is sent a signal
        runner.wait()
        assert wait_for(lambda: not any(alive(pid) for pid in started), BOUND_S), \
            [(pid, Path(f"/proc/{pid}/cmdline").read_bytes()) for pid in started if alive(pid)]
        print(f"all {len(started)} agent processes gone {time.monotonic() - killed_at:.2f} s after the SIGKILL")
        assert wait_for(lambda: not any(alive(pid) for pid in watchdogs), BOUND_S)  # and the watchdog exits
        assert not list(Path("/sys/fs/cgroup").rglob(f"rlproxy-run-{runner.pid}-*"))  # its cgroup removed
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
        for pid in (int(p) for p in (pids.read_text().split() if pids.exists() else ())):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def _started_by(pid: int, runner: int) -> bool:
    """Whether this watchdog was started by `runner` (its parent then; adopted by another since)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return int(stat[stat.rindex(")") + 2:].split()[1]) == runner


def test_the_watchdog_ends_the_groups_it_was_told_of_when_its_input_ends():
    """runner/watchdog.py alone: `+PGID` lines, then the end of its input without `exit`."""
    group = subprocess.Popen(["sleep", "300"], start_new_session=True)
    watchdog = subprocess.Popen([sys.executable, "-m", "runner.watchdog"], stdin=subprocess.PIPE, text=True,
                                start_new_session=True)
    watchdog.stdin.write(f"+{group.pid}\n")
    watchdog.stdin.close()  # as when the runner dies
    assert watchdog.wait(BOUND_S) == 0
    assert group.wait(BOUND_S) == -signal.SIGKILL
    kept = subprocess.Popen(["sleep", "300"], start_new_session=True)
    watchdog = subprocess.Popen([sys.executable, "-m", "runner.watchdog"], stdin=subprocess.PIPE, text=True,
                                start_new_session=True)
    watchdog.communicate(f"+{kept.pid}\nexit\n", timeout=BOUND_S)  # the run ended on its own: nothing to end
    assert kept.poll() is None
    kept.kill()
    kept.wait()
