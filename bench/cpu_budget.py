"""The CPU budget of a call in bench/load.py: what each serving process spends (user+sys, its threads and
children included) per call it answers, beside its throughput. Throughput on a shared machine moves with
everything else running there; CPU time per call much less, and against the stub engine's in the same run (a
ratio) hardly at all: a change that costs the proxy CPU shows in it whatever the machine is doing. The results
file starts with the machine it ran on (`machine`)."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil


def cpu_seconds(process: psutil.Process | None) -> float:
    """The user+sys CPU time the process and its children (a server's workers) have used, threads included; 0
    without one."""
    if process is None:
        return 0.0
    total = 0.0
    for each in [process, *process.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = each.cpu_times()
            total += times.user + times.system
    return total


def print_cpu_budget(rows: list[dict], targets: list, level: int = 16) -> None:
    """The CPU budget per call at `level` clients: each target's process CPU (user+sys) per answered call, its calls
    per CPU second, and those against the stub's in the same cell (the engine stand-in's own cost: what a proxy
    costs beside the work it relays). CPU time moves much less with the machine's other load than throughput."""
    cell = {(r["target"], r["stream"], r["concurrency"]): r for r in rows}
    if not any(key[2] == level for key in cell):
        return
    print(f"\nCPU budget at {level} clients: the serving process's CPU (user+sys) per answered call, over the "
          "measured windows")
    print(f"{'target':<18}{'kind':>15}{'req/s':>9}{'CPU us/call':>13}{'calls/CPU s':>13}{'vs stub':>9}")
    for stream in (False, True):
        stub = cell.get(("stub", stream, level))
        for target in targets:
            row = cell.get((target.name, stream, level))
            if row is None or row.get("cpu_us") in (None, 0):
                continue
            per_cpu = 1e6 / row["cpu_us"]
            versus = f"{per_cpu * stub['cpu_us'] / 1e6:.3f}" if stub and stub.get("cpu_us") else ""
            print(f"{target.name:<18}{'streaming' if stream else 'non-streaming':>15}{row['rps']:>9.0f}"
                  f"{row['cpu_us']:>13.0f}{per_cpu:>13.0f}{versus:>9}")


def machine() -> str:
    """What the run ran on, for the results file: the CPU, its cores, memory, load, Python, the commit."""
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown CPU") if Path("/proc/cpuinfo").exists() else "unknown"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent.parent).stdout.strip() or "?"
    load1, load5, _ = os.getloadavg()
    return (f"machine: {model}, {psutil.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB; "
            f"load average {load1:.1f}/{load5:.1f} at start; Python {sys.version.split()[0]}; commit {commit}; "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
