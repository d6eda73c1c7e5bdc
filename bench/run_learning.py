"""`rlproxy run` trains the demo task, as a user runs it: `rlproxy serve` and `rlproxy train` (default settings)
as processes on Postgres in front of the engine, and `rlproxy run` driving the demo's calculator agent
(examples/run_calculator.py) over a file of training tasks, the agent named either way:

    --agent examples.run_calculator:solve                 (mode "agent": a function, in the runner's process)
    --command "python -m examples.run_calculator"         (mode "command": a program per attempt)

Held-out success is measured by `rlproxy run --eval-tasks` (evaluation rollouts, never trained on) on the same
48 held-out tasks before training and after the trainer has served its last version.

    .venv/bin/python bench/run_learning.py                          # both modes, one after the other
    .venv/bin/python bench/run_learning.py --modes agent --engine-url http://127.0.0.1:8000
    .venv/bin/python bench/run_learning.py --modes agent --max-untrained 0 --seeds 11,12,13 --correction off

The trainer runs at its defaults unless told: `--correction off` is the computation before issue 36 (the PPO ratio
against the engine's log-probs, no importance weight, no dual clip, calls more than 2 versions behind dropped:
OLD_COMPUTATION below), and `--trainer-set NAME=VALUE` passes any training setting on (`rlproxy train --set`).
After each run the trainer's own records say what it did with the training rollouts (bench/training_accounting.py):
trained, or dropped and why, per rollout and per call.

Each run's result lines are printed and appended to bench/results/run_learning.txt, with the date, the machine and
the trainer's settings, as soon as the run ends.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.learning_runs import cpu_model  # noqa: E402
from bench.training_accounting import account  # noqa: E402
from core.settings import TrainingSettings  # noqa: E402
from demo.tasks import heldout_tasks, train_tasks  # noqa: E402
from engine.model import prepare_model  # noqa: E402
from testkit.processes import (  # noqa: E402
    create_database,
    free_port,
    proxy_command,
    rlproxy_command,
    running,
    trainer_command,
)

AGENTS = {"agent": ("--agent", "examples.run_calculator:solve"),
          "command": ("--command", f"{sys.executable} -m examples.run_calculator")}
RESULTS = ROOT / "bench" / "results" / "run_learning.txt"
ATTEMPTS = 8  # a task's attempts: the trainer's group (its default group_size)
# How a step was computed before issue 36's off-policy correction, as training settings: the ratio against the
# engine's log-probs with no importance weight, no dual clip, the old staleness bound, one batch of 16 rollouts a
# step whatever waits (no larger step over a backlog), the full learning rate however little a step trains. (What
# cannot be turned back: task groups are found among all waiting rollouts, and dropped calls are counted once.)
OLD_COMPUTATION = ("proximal_policy=behaviour", "is_correction_level=off", "dual_clip=0", "max_staleness=2",
                   "max_batch_rollouts=16", "scale_lr_to_batch=false")


def write_tasks(path: Path, tasks) -> Path:
    with path.open("w") as file:
        for task in tasks:
            file.write(json.dumps({"id": task.task_id, "prompt": task.prompt, "answer": task.answer,
                                   "tool": task.tool}) + "\n")
    return path


def get(url: str):
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def rlproxy_run(proxy: str, mode: str, workdir: Path, name: str, *args: str) -> list[dict]:
    """`rlproxy run` with the agent named by `mode`; every finished attempt of its JSON lines log."""
    log = workdir / f"{name}.jsonl"
    flag, target = AGENTS[mode]
    command = rlproxy_command("run", "--proxy", proxy, flag, target, "--concurrency", "16", "--log", str(log),
                              "--task-id-field", "id",
                              *args)
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    return [e for e in entries if e.get("event") == "finished" and e.get("status") != "try_failed"]  # (retried)


def success(finished: list[dict]) -> tuple[int, int]:
    return sum(1 for f in finished if (f.get("reward") or 0) >= 1.0), len(finished)


def wait_until_served(proxy: str, rollout_ids: list[str], timeout: float = 1800) -> int:
    """Until the trainer has consumed every training rollout and the newest version serves; returns it."""
    deadline = time.monotonic() + timeout
    waiting = list(rollout_ids)
    while time.monotonic() < deadline:
        waiting = [rollout for rollout in waiting if not get(f"{proxy}/rollouts/{rollout}")["trained"]]
        body = get(f"{proxy}/policies")
        newest = max(p["version"] for p in body["data"])
        if not waiting and body["active"] == newest:
            return newest
        time.sleep(3)
    raise TimeoutError(f"the trainer did not train and serve everything in time ({len(waiting)} rollouts left)")


def start_proxy(stack: ExitStack, engine: str, database: str, workdir: Path) -> str:
    """`rlproxy serve` in front of `engine` on `database` until `stack` closes, its spool and log in `workdir`."""
    port = free_port()
    proxy = f"http://127.0.0.1:{port}"
    stack.enter_context(running(proxy_command(port, [engine], database, "--spool-path", str(workdir / "spool")),
                                f"{proxy}/readyz", timeout=120, log_path=workdir / "proxy.log"))
    return proxy


def one_mode(mode: str, engine: str, postgres: str, train_count: int, seed: int, max_untrained: int,
             trainer_set: list[str], keep_logs: Path | None = None) -> list[str]:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"run-learning-{mode}-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        database = create_database(postgres, "rlproxy_run_learning")
        proxy = start_proxy(stack, engine, database, workdir)
        sets = [arg for pair in trainer_set for arg in ("--set", pair)]
        stack.enter_context(running(trainer_command(database, engine, prepare_model(), workdir / "adapters", *sets),
                                    None, log_path=workdir / "trainer.log"))
        train = write_tasks(workdir / "train.jsonl", train_tasks(train_count, seed=seed))
        heldout = write_tasks(workdir / "heldout.jsonl", heldout_tasks(48, seed=0))
        before = success(rlproxy_run(proxy, mode, workdir, "before", "--eval-tasks", str(heldout)))
        trained = rlproxy_run(proxy, mode, workdir, "train", "--tasks", str(train), "--attempts", str(ATTEMPTS),
                              "--max-untrained", str(max_untrained))
        rollout_ids = [f["rollout_id"] for f in trained if f.get("rollout_id")]
        version = wait_until_served(proxy, rollout_ids)
        accounting = account(database, rollout_ids, max_staleness=max_staleness(trainer_set))
        after = success(rlproxy_run(proxy, mode, workdir, "after", "--eval-tasks", str(heldout)))
        rewards = [f.get("reward") or 0 for f in trained]
        quarters = [rewards[len(rewards) * i // 4:len(rewards) * (i + 1) // 4] for i in range(4)]  # in finish order
        quarters = [round(sum(q) / len(q), 2) for q in quarters if q]
        if keep_logs is not None:
            keep_logs.mkdir(parents=True, exist_ok=True)
            for name in ("trainer.log", "proxy.log", "train.jsonl"):
                shutil.copy(workdir / name, keep_logs / f"{mode}-seed{seed}-{name}")
    return [(f"{mode} seed {seed}: held-out success base {before[0]}/{before[1]} -> v{version} {after[0]}/{after[1]} "
             f"({(after[0] / after[1] - before[0] / before[1]) * 100:+.1f} points); {len(trained)} training attempts "
             f"of {train_count} tasks x {ATTEMPTS}, training reward {sum(rewards) / len(rewards):.2f} "
             f"(by quarter of the run: {quarters}); {time.monotonic() - started:.0f} s"),
            f"  trainer: {accounting.describe()}"]


def max_staleness(trainer_set: list[str]) -> int:
    """The trainer's max_staleness under these `--set` pairs (the default unless one names it)."""
    given = dict(pair.split("=", 1) for pair in trainer_set)
    return int(given.get("max_staleness", TrainingSettings().max_staleness))


def start_engine(stack: ExitStack) -> str:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = rlproxy_command("engine", "--port", str(port), "--max-model-len", "2048", "--kv-cache-gib", "1",
                              "--max-lora-rank", "8")
    stack.enter_context(running(command, f"{url}/v1/models", timeout=600,
                                log_path=Path(tempfile.gettempdir()) / "run-learning-engine.log"))
    return url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default="agent,command")
    parser.add_argument("--engine-url", help="an engine already running (default: `rlproxy engine` is started)")
    parser.add_argument("--postgres", default=os.environ.get("RLPROXY_TEST_POSTGRES",
                                                             "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--train-tasks", type=int, default=12, help="distinct training tasks, ATTEMPTS each")
    parser.add_argument("--seeds", default="11", help="training task seeds, comma-separated: one run each")
    parser.add_argument("--correction", choices=("on", "off"), default="on",
                        help="on: the trainer's defaults; off: the computation before issue 36 (OLD_COMPUTATION)")
    parser.add_argument("--keep-logs", type=Path, help="a folder to copy each run's trainer and proxy logs into")
    parser.add_argument("--trainer-set", action="append", default=[], metavar="NAME=VALUE",
                        help="a training setting for `rlproxy train --set` (repeat; after --correction's)")
    parser.add_argument("--max-untrained", type=int, default=16,
                        help="rlproxy run --max-untrained: 16, the trainer's batch, gives on-policy rounds; 0: none")
    args = parser.parse_args()
    trainer_set = (list(OLD_COMPUTATION) if args.correction == "off" else []) + args.trainer_set
    with ExitStack() as stack:
        engine = args.engine_url or start_engine(stack)
        for seed in (int(s) for s in args.seeds.split(",")):
            for mode in args.modes.split(","):
                lines = one_mode(mode, engine, args.postgres, args.train_tasks, seed, args.max_untrained, trainer_set,
                                 args.keep_logs)
                print("\n".join(lines), flush=True)
                with RESULTS.open("a") as file:  # each run as it ends: a long series stopped halfway keeps its runs
                    file.write(f"## {datetime.date.today()} {cpu_model()}, {os.cpu_count()} cores: "
                               f"bench/run_learning.py --train-tasks {args.train_tasks} --seed {seed} "
                               f"--max-untrained {args.max_untrained} --correction {args.correction}"
                               + "".join(f" --trainer-set {pair}" for pair in args.trainer_set)
                               + f" (trainer --set: {' '.join(trainer_set) or 'none, its defaults'})\n"
                               + "\n".join(lines) + "\n\n")


if __name__ == "__main__":
    main()
