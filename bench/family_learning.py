"""One task family learned the way a user would run rlproxy: `rlproxy engine`, `rlproxy serve` and `rlproxy
train` with default settings as separate processes on a fresh Postgres database, and the family's plain
`openai`-SDK agent (bench/family_agent.py) driven over the family's items by the runner (runner/).

The clock starts once the base model's held-out success is measured. Then the agent runs groups of training
rollouts and, every `eval_every` minutes and at the end, the whole held-out set as evaluation rollouts. It
paces itself on the trainer: while `ahead` batches of its rollouts are not consumed yet, it waits (on 2 cores an
agent that never waits takes the cores the trainer needs, and what it samples goes stale before it is trained
on). It waits on consumption, not on new versions: a batch in which every group scored alike teaches nothing
and is consumed without one. Every process's peak resident memory is sampled throughout.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import math
import os
import random
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import requests

from bench.families import Family
from bench.family_agent import FamilyAgent
from bench.memory import GB, Watch, _status
from core.settings import TrainingSettings
from rlproxy.commands.train import training_from
from store.evaluation import wilson
from testkit.processes import create_database, free_port, rlproxy_command, running

HELDOUT_SAMPLES = 96  # held-out rollouts per evaluation (the held-out items, cycled, even over strata)
ENGINE_ARGS = ("--max-model-len", "2048", "--kv-cache-gib", "1", "--max-lora-rank", "8", "--max-loras", "4")


@dataclasses.dataclass
class Evaluation:
    minutes: float  # on the training clock
    version: int  # the active version when it began
    success: float
    n: int

    def interval(self) -> tuple[float, float]:
        return wilson(self.success * self.n, self.n)


class MemoryWatch:
    """Peak RSS per process of the runs it is given, sampled every `interval` seconds in a thread."""

    def __init__(self, interval: float = 2.0) -> None:
        self.watches: list[Watch] = []
        self.interval = interval
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def add(self, pid: int, label: str) -> None:
        self.watches.append(Watch(pid, label))

    def _loop(self) -> None:
        while not self.stopped.wait(self.interval):
            for watch in self.watches:
                watch.sample()

    def __enter__(self) -> MemoryWatch:
        self.thread.start()
        return self

    def __exit__(self, *_) -> None:
        self.stopped.set()
        self.thread.join()

    def peaks(self) -> dict[str, float]:
        """GB per role (engine processes summed), the agent's own, and the sum of them all."""
        roles: dict[str, float] = {}
        for watch in self.watches:
            roles[watch.root_label] = sum(peak for _, peak in watch.peaks.values()) / GB
        roles.setdefault("engine", float("nan"))
        roles["agent"] = _status(os.getpid()).get("VmHWM", 0) / GB
        roles["sum"] = sum(value for value in roles.values() if not math.isnan(value))
        return roles


async def train_and_evaluate(agent: FamilyAgent, family: Family, minutes: float, eval_every: float,
                             ahead: int, log, config: TrainingSettings) -> tuple[Evaluation, list[Evaluation], int]:
    """`config` is the trainer's: the agent paces itself by its batch and group sizes."""
    heldout_samples = family.sample("heldout", HELDOUT_SAMPLES)
    rng = random.Random(family.name)

    async def evaluation(clock: float) -> Evaluation:
        version = await agent.active_version()
        success = await agent.evaluate(heldout_samples)
        done = Evaluation(clock, version, success, len(heldout_samples))
        log(f"held-out {success:.0%} (n={done.n}) with v{version} at {clock:.1f} min")
        return done

    base = await evaluation(0.0)
    began = time.monotonic()
    evaluations: list[Evaluation] = []
    waiting: collections.deque[str] = collections.deque()  # own training rollouts, oldest first, not seen consumed
    rollouts = 0
    next_eval = eval_every
    groups_at_once = max(1, config.batch_rollouts // config.group_size)
    while (clock := (time.monotonic() - began) / 60) < minutes:
        if clock >= next_eval:
            evaluations.append(await evaluation(clock))
            next_eval += eval_every
            continue
        while waiting and await agent.trained(waiting[0]):
            waiting.popleft()
        if len(waiting) >= ahead * config.batch_rollouts:
            await asyncio.sleep(1.0)  # enough waits for the trainer already
            continue
        version = await agent.active_version()
        items = family.sample("train", groups_at_once, rng)
        done = await agent.groups(items, config.group_size)
        waiting.extend(rollout_id for rollout_id, _ in done)
        rollouts += len(done)
        log(f"v{version}: {len(done)} rollouts, success {sum(reward >= 1 for _, reward in done)}/{len(done)}")
    evaluations.append(await evaluation((time.monotonic() - began) / 60))
    return base, evaluations, rollouts


def run_family(family: Family, minutes: float, out: Path, postgres: str, eval_every: float = 2.5,
               ahead: int = 2, engine_url: str | None = None, train_settings: list[str] = ()) -> dict:
    """The whole run; returns the summary row (and writes it, with every evaluation, to out/NAME/result.json)."""
    workdir = out / family.name
    workdir.mkdir(parents=True, exist_ok=False)
    def log(message: str) -> None:
        with open(workdir / "agent.log", "a") as lines:
            lines.write(f"{time.strftime('%H:%M:%S')} {message}\n")

    database = create_database(postgres, f"bench_{family.name}", migrate=False)  # `rlproxy serve` migrates it
    proxy_port = free_port()
    proxy_url = f"http://127.0.0.1:{proxy_port}"
    with ExitStack() as stack, MemoryWatch() as memory:
        if engine_url is None:  # else a running engine is shared (and its memory not counted)
            engine_port = free_port()
            engine_url = f"http://127.0.0.1:{engine_port}"
            engine = stack.enter_context(running(rlproxy_command("engine", "--port", str(engine_port), *ENGINE_ARGS),
                                                 f"{engine_url}/v1/models", timeout=900,
                                                 log_path=workdir / "engine.log"))
            memory.add(engine.pid, "engine")
        proxy = stack.enter_context(running(
            rlproxy_command("serve", "--port", str(proxy_port), "--upstream", engine_url, "--database-url", database,
                            "--spool-path", str(workdir / "spool.jsonl")),
            f"{proxy_url}/healthz", log_path=workdir / "serve.log"))
        memory.add(proxy.pid, "proxy")
        trainer = stack.enter_context(running(
            rlproxy_command("train", "--upstream", engine_url, "--database-url", database, "--adapters-dir",
                            str(workdir / "adapters"), "--metrics-port", "0",
                            *(flag for setting in train_settings for flag in ("--set", setting))),
            None, log_path=workdir / "train.log"))
        memory.add(trainer.pid, "trainer")
        model = requests.get(f"{proxy_url}/v1/models", timeout=30).json()["data"][0]["id"]

        async def session():
            async with FamilyAgent(proxy_url, model, family) as agent:
                return await train_and_evaluate(agent, family, minutes, eval_every, ahead, log,
                                                training_from(list(train_settings)))

        base, evaluations, rollouts = asyncio.run(session())
        if trainer.poll() is not None:
            raise RuntimeError(f"the trainer exited with {trainer.returncode}: see {workdir / 'train.log'}")
        peaks = memory.peaks()
    result = summarize(family, base, evaluations, rollouts, peaks, minutes)
    (workdir / "result.json").write_text(json.dumps(
        {**result, "evaluations": [dataclasses.asdict(e) for e in [base, *evaluations]]}, indent=1))
    return result


def summarize(family: Family, base: Evaluation, evaluations: list[Evaluation], rollouts: int,
              peaks: dict[str, float], minutes: float, target: float = 0.25) -> dict:
    final = evaluations[-1]
    reached = next((e.minutes for e in evaluations if e.success >= base.success + target), None)
    return {"family": family.name, "base": base.success, "base_interval": base.interval(), "final": final.success,
            "final_interval": final.interval(), "final_version": final.version, "n": final.n,
            "best": max(e.success for e in evaluations), "minutes_to_target": reached,
            "training_rollouts": rollouts, "minutes": minutes, "peak_gb": peaks}
