"""Self-distillation on the demo task: the student runs the calculator agent with the rules alone (no worked
examples: `calc-zero`), and the trainer's teacher is its own base model shown the demo's two worked examples as chat
turns before the question (`--teacher self --teacher-context-file` with a JSON array of messages,
`--teacher-context-at before_last_user`: exactly the demo's own `calc-chat2` opening, 31% held out in
docs/demo-tasks.md). The same examples written into the system message (`calc-sys2`) score 0% there (0/48 measured
again here), so they would teach nothing.
Three arms on the same traffic budget, each on a fresh database, unpaced (`rlproxy run --max-untrained 0`):

    distill   the agent posts no reward at all: rollouts close after --teacher-idle-s of silence, and the teacher's
              gap is the only signal (--teacher-advantage only)
    rl        the trainer's defaults, the agent's reward posted (no teacher)
    both      the teacher's gap added to the reward's advantage

Before the arms, the teacher's own held-out success is measured (the base model prompted as the teacher sees it),
and the student's base (calc-zero). Held-out success: 48 held-out tasks as evaluation rollouts (never trained),
before training and once the trainer serves its last version.

    .venv/bin/python bench/distill.py                                   # all arms, seeds 11,12,13 (about 70 min)
    .venv/bin/python bench/distill.py --arms teacher --engine-url http://127.0.0.1:8000   # the teacher alone (2 min)
    .venv/bin/python bench/distill.py --arms distill --seeds 11 --train-tasks 2          # a smoke run (5 min)

Result lines are printed and appended to bench/results/distill.txt as each run ends.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import openai  # noqa: E402

from bench.learning_runs import cpu_model  # noqa: E402
from bench.run_learning import (  # noqa: E402
    ATTEMPTS,
    start_engine,
    start_proxy,
    success,
    wait_until_served,
    write_tasks,
)
from demo.agent import PROMPTS, run_episode  # noqa: E402
from demo.tasks import heldout_tasks, train_tasks  # noqa: E402
from engine.model import prepare_model  # noqa: E402
from examples.run_calculator import as_task  # noqa: E402
from testkit.processes import create_database, rlproxy_command, running, trainer_command  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "distill.txt"
STUDENT = PROMPTS["calc-zero"]  # the rules alone
TEACHER_VIEW = PROMPTS["calc-chat2"]  # the rules, then two worked examples as chat turns: the demo's prompt
assert TEACHER_VIEW.system == STUDENT.system
CONTEXT = json.dumps([{"role": role, "content": content} for role, content in TEACHER_VIEW.few_shot])
IDLE_S = 5  # --teacher-idle-s: how long a distill arm's unrewarded rollout waits before it is closed and trained
ARMS = {
    "distill": ("unrewarded", ["--teacher", "self", "--teacher-advantage", "only"]),
    "rl": ("rewarded", []),
    "both": ("rewarded", ["--teacher", "self"]),
}


async def _reward(task: dict, config, prompting) -> float:
    async with openai.AsyncOpenAI(base_url=config.openai_base_url, api_key=config.api_key, max_retries=0) as client:
        return (await run_episode(client, config.model, as_task(task), prompting=prompting)).reward


async def student(task: dict, config) -> float:
    """`--agent bench.distill:student`: the calculator agent without worked examples, its reward returned."""
    return await _reward(task, config, STUDENT)


async def student_unrewarded(task: dict, config) -> None:
    """The same agent posting no reward (the runner then posts none): what a team without a verifier runs."""
    await _reward(task, config, STUDENT)


async def teacher_view(task: dict, config) -> float:
    """The base model prompted as the teacher sees the student's prompts: its own held-out success."""
    return await _reward(task, config, TEACHER_VIEW)


def run(proxy: str, workdir: Path, name: str, agent: str, *args: str) -> list[dict]:
    """`rlproxy run --agent bench.distill:AGENT`; every finished attempt of its JSON lines log."""
    log = workdir / f"{name}.jsonl"
    command = rlproxy_command("run", "--proxy", proxy, "--agent", f"bench.distill:{agent}", "--concurrency", "16",
                              "--log", str(log), "--task-id-field", "id", *args)
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    return [e for e in entries if e.get("event") == "finished" and e.get("status") != "try_failed"]


def heldout(proxy: str, workdir: Path, name: str, agent: str) -> tuple[int, int]:
    return success(run(proxy, workdir, name, agent, "--eval-tasks", str(workdir / "heldout.jsonl")))


def one_arm(arm: str, engine: str, postgres: str, train_count: int, seed: int, max_untrained: int) -> str:
    started = time.monotonic()
    agent, flags = ARMS[arm]
    with tempfile.TemporaryDirectory(prefix=f"distill-{arm}-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        (workdir / "context.txt").write_text(CONTEXT)
        if flags:
            flags = [*flags, "--teacher-context-file", str(workdir / "context.txt"), "--teacher-context-at",
                     "before_last_user", "--teacher-idle-s", str(IDLE_S)]
        database = create_database(postgres, "rlproxy_distill")
        proxy = start_proxy(stack, engine, database, workdir)
        stack.enter_context(running(trainer_command(database, engine, prepare_model(), workdir / "adapters", *flags),
                                    None, log_path=workdir / "trainer.log"))
        write_tasks(workdir / "heldout.jsonl", heldout_tasks(48, seed=0))
        train = write_tasks(workdir / "train.jsonl", train_tasks(train_count, seed=seed))
        before = heldout(proxy, workdir, "before", "student")
        runner_agent = "student" if agent == "rewarded" else "student_unrewarded"
        trained = run(proxy, workdir, "train", runner_agent, "--tasks", str(train), "--attempts", str(ATTEMPTS),
                      "--max-untrained", str(max_untrained))
        version = wait_until_served(proxy, [f["rollout_id"] for f in trained if f.get("rollout_id")])
        after = heldout(proxy, workdir, "after", "student")
        gaps = [line.split("KL ")[1].split(" ")[0] for line in (workdir / "trainer.log").read_text().splitlines()
                if "teacher self: KL " in line]
    return (f"{arm} seed {seed}: held-out base {before[0]}/{before[1]} -> v{version} {after[0]}/{after[1]} "
            f"({(after[0] / after[1] - before[0] / before[1]) * 100:+.1f} points); {len(trained)} training attempts "
            f"({agent}); teacher KL per token by step: {', '.join(gaps) or 'none'}; {time.monotonic() - started:.0f} s")


def teacher_alone(engine: str, postgres: str) -> str:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="distill-teacher-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        proxy = start_proxy(stack, engine, create_database(postgres, "rlproxy_distill"), workdir)
        write_tasks(workdir / "heldout.jsonl", heldout_tasks(48, seed=0))
        teacher, base = heldout(proxy, workdir, "teacher", "teacher_view"), heldout(proxy, workdir, "base", "student")
    return (f"teacher (base model, two worked examples as chat turns) {teacher[0]}/{teacher[1]} held out; "
            f"student base (rules alone) {base[0]}/{base[1]}; {time.monotonic() - started:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", default="teacher,distill,rl,both", help="teacher (its own success) and the arms")
    parser.add_argument("--engine-url", help="an engine already running (default: `rlproxy engine` is started)")
    parser.add_argument("--postgres", default=os.environ.get("RLPROXY_TEST_POSTGRES",
                                                             "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--train-tasks", type=int, default=12, help=f"distinct training tasks, {ATTEMPTS} attempts each")
    parser.add_argument("--seeds", default="11,12,13")
    parser.add_argument("--max-untrained", type=int, default=0, help="rlproxy run --max-untrained; 0: unpaced")
    args = parser.parse_args()
    arms = args.arms.split(",")
    with ExitStack() as stack:
        engine = args.engine_url or start_engine(stack)
        lines = [teacher_alone(engine, args.postgres)] if "teacher" in arms else []
        record(lines, args)
        for seed in (int(s) for s in args.seeds.split(",")):
            for arm in (a for a in arms if a != "teacher"):
                record([one_arm(arm, engine, args.postgres, args.train_tasks, seed, args.max_untrained)], args)


def record(lines: list[str], args: argparse.Namespace) -> None:
    if not lines:
        return
    print("\n".join(lines), flush=True)
    with RESULTS.open("a") as file:
        file.write(f"## {datetime.date.today()} {cpu_model()}, {os.cpu_count()} cores: bench/distill.py --arms "
                   f"{args.arms} --seeds {args.seeds} --train-tasks {args.train_tasks} --max-untrained "
                   f"{args.max_untrained}\n" + "\n".join(lines) + "\n\n")


if __name__ == "__main__":
    main()
