"""No rank waits for a dead peer for long (trainer/liveness.py, trainer/parallel.py): two CPU ranks joined as
`rlproxy train` joins them, but without torchrun (which would stop the survivor itself on one machine, and
cannot across machines): SIGKILL one, idle or mid-step, and the other exits with a message naming what it lost
within collective_timeout_s. While they idle, every rank's heartbeat file (what the chart's liveness probe
reads) stays fresh."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.support import ROOT, free_port

pytest.importorskip("torch")
pytestmark = pytest.mark.train

TIMEOUT = 4.0  # collective_timeout_s
SLACK = 8.0  # the watch's interval, logging and the process' exit, on a loaded 2-core machine


def start_ranks(model, mode: str, folder):
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    ranks = []
    for rank in (0, 1):
        log = open(folder / f"rank-{rank}.log", "wb")
        ranks.append(subprocess.Popen(
            [sys.executable, "tests/parallel_idle.py", str(model), mode, str(TIMEOUT), str(folder / "heartbeats")],
            cwd=ROOT, env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}, stdout=log, stderr=subprocess.STDOUT))
    return ranks


def wait_for_line(path, text: str, ranks, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in path.read_text(errors="replace"):
        assert all(r.poll() is None for r in ranks), path.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, f"no {text!r} in {path}"
        time.sleep(0.1)


@pytest.mark.parametrize("mode, killed, message", [
    ("idle", 1, "ALERT: rank 0: rank 1 has not been heard from"),  # rank 0 polls the store: nothing in flight
    ("idle", 0, "ALERT: rank 1:"),  # waiting for rank 0's next command
    # inside a step's collective: gloo sees the socket close at once (NCCL would not; then the watch does)
    ("step", 1, "ALERT: rank 0: (rank 1 has not been heard from|lost a peer rank during step)"),
])
def test_a_rank_killed_makes_the_other_exit_within_the_collective_timeout(tiny_model, tmp_path, mode, killed,
                                                                          message):
    ranks = start_ranks(tiny_model, mode, tmp_path)
    try:
        wait_for_line(tmp_path / "rank-0.log", "stepped" if mode == "step" else "ready", ranks)
        if mode == "idle":
            time.sleep(2 * TIMEOUT)  # idle longer than the timeout: waiting for work is no failure
            assert all(r.poll() is None for r in ranks)
            for rank in (0, 1):  # the liveness probe's files: touched while idle
                assert time.time() - (tmp_path / "heartbeats" / f"rank-{rank}").stat().st_mtime < 3.0
        ranks[killed].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        survivor = ranks[1 - killed]
        code = survivor.wait(timeout=TIMEOUT + SLACK + 30)
        took = time.monotonic() - killed_at
    finally:
        for r in ranks:
            if r.poll() is None:
                r.kill()
                r.wait()
    log = (tmp_path / f"rank-{1 - killed}.log").read_text(errors="replace")
    assert code != 0, log[-3000:]
    assert took <= TIMEOUT + SLACK, (took, log[-3000:])
    assert re.search(message, log), log[-3000:]
