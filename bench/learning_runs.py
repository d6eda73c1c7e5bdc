"""The learning measurements that are too long for every CI run: each is one of the suite's own end-to-end
tests run at the size where learning shows (and asserted there), `--runs` times, its printed result kept.

    .venv/bin/python bench/learning_runs.py judge            # tests/test_judge_learning.py, 7 rounds of 32
    .venv/bin/python bench/learning_runs.py multi-agent      # tests/test_multi_agent.py, 6 rounds
    .venv/bin/python bench/learning_runs.py learning --runs 5  # tests/test_learning.py as CI runs it, 5 times
    .venv/bin/python bench/learning_runs.py learning-2-ranks   # the same, `rlproxy train --nproc-per-node 2`

CI runs the same tests at their default, short size (routing, recording and that training happened); the test
that proves learning with default settings, tests/test_learning.py, runs in CI at full size, and `learning`
here repeats it to show its margin holds run after run. Each run's outcome and printed measurement are appended
to bench/results/<name>.txt with the date, the machine and the time it took.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MEASUREMENTS = {
    "judge": ("tests/test_judge_learning.py", {"RLPROXY_TEST_JUDGE_ROUNDS": "7", "RLPROXY_TEST_JUDGE_BATCH": "32",
                                                "RLPROXY_TEST_JUDGE_HELDOUT": "48"}),
    "multi-agent": ("tests/test_multi_agent.py", {"RLPROXY_TEST_MULTI_AGENT_ROUNDS": "6",
                                                   "RLPROXY_TEST_MULTI_AGENT_HELDOUT": "32",
                                                   "RLPROXY_TEST_MULTI_AGENT_PER_PROJECT": "16"}),
    "learning": ("tests/test_learning.py", {}),
    # the same with the trainer on two ranks (torchrun, the base sharded with FSDP2): learns as one process does
    "learning-2-ranks": ("tests/test_learning.py", {"RLPROXY_TEST_TRAINER_RANKS": "2"}),
}
# What the tests print about learning (one line each).
RESULT_MARKERS = ("held-out success", "held-out solver success")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def run_once(test: str, env: dict[str, str]) -> tuple[bool, list[str], float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", test],
                          cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True)
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip().startswith(RESULT_MARKERS)]
    if done.returncode != 0:
        lines += [line for line in done.stdout.splitlines() if line.startswith(("E ", "FAILED"))][-5:]
    return done.returncode == 0, lines, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=sorted(MEASUREMENTS))
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--out", type=Path, help="default: bench/results/<name>.txt")
    args = parser.parse_args()
    test, env = MEASUREMENTS[args.name]
    out = args.out or ROOT / "bench" / "results" / f"{args.name}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    sizes = " ".join(f"{k}={v}" for k, v in env.items()) or "(the CI size)"
    header = (f"## {datetime.date.today()} {cpu_model()}, {os.cpu_count()} cores: {test} {sizes}, "
              f"{args.runs} run(s)")
    print(header, flush=True)
    passed = 0
    with out.open("a") as log:
        log.write(header + "\n")
        for run in range(1, args.runs + 1):
            ok, lines, seconds = run_once(test, env)
            passed += ok
            line = f"run {run}: {'passed' if ok else 'FAILED'} in {seconds:.0f} s: " + " | ".join(lines)
            print(line, flush=True)
            log.write(line + "\n")
            log.flush()
        summary = f"{passed} of {args.runs} passed"
        print(summary)
        log.write(summary + "\n\n")
    sys.exit(0 if passed == args.runs else 1)


if __name__ == "__main__":
    main()
