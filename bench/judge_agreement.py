"""Can the default judge judge? The base model (the bundled SmolLM2-135M-Instruct) as the judge of
`rlproxy train --reward judge`, measured against the three bench families' own scorers (bench/families/).

    python -m bench.judge_agreement [--items 10] [--group 4] [--out bench/results/judge_agreement.txt]

It starts `rlproxy engine` on the bundled model and `rlproxy serve` in front of it (a fresh SQLite store), and
runs an agent with no reward code: for each of `--items` training items per family, `--group` replies of the
base model at the agents' temperature, one rollout each, nothing posted. Then the trainer's own judge job
(trainer/judge.py, default judge settings: the engine's base model, the built-in rubric, temperature 0) scores
them by task group, exactly as `rlproxy train --reward judge` would, and its stored scores are compared with
what the family's scorer says of the same replies:

    pairwise   of the pairs in one group the scorer tells apart (one success, one failure), the share the judge
               orders the same way, a tie counting half. Chance is 50%; it is the part of a score that GRPO-style
               group advantages use.
    accuracy   the judge's score >= 0.5 against the scorer's success, beside always answering the majority.
    kept       groups whose reply kept the JSON contract (the rest are left unjudged).

Groups are judged several at a time (the engine batches them) and each is asked once (`judge_attempts` 1: at
temperature 0 a repeat mostly repeats the reply); `judge_max_tokens` stops a judge that rambles on.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import random
import tempfile
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import httpx
import openai
from sqlalchemy import select

from bench.families import FAMILIES, Family, Item
from bench.family_agent import TEMPERATURE
from bench.family_learning import ENGINE_ARGS
from core.settings import TrainerSettings
from store import judging
from store.db import open_database, session_factory
from store.evaluation import wilson
from store.judging import JUDGE_REASON
from store.models import Reward, utcnow
from testkit.processes import free_port, proxy_command, rlproxy_command, running
from trainer.judge import JudgeJob, ready_groups
from trainer.metrics import TrainerMetrics

JUDGE_MAX_TOKENS = 400  # a group of 4 in the reply contract with one-sentence explanations takes about 200
CONCURRENT_GROUPS = 6


@dataclass
class Verdict:
    family: str
    item_id: str
    rollout_id: str
    success: float  # the family scorer's
    judge: float | None = None  # the judge's score; None: its group was left unjudged


async def sample(proxy: str, model: str, family: Family, items: list[Item], group: int) -> list[Verdict]:
    """`group` rollouts of each item through the proxy, as an agent with no reward code; scored by the family
    here, never told to rlproxy."""
    client = openai.AsyncOpenAI(base_url=f"{proxy}/v1", api_key="bench", max_retries=2, timeout=300)
    slots = asyncio.Semaphore(8)

    async def one(item: Item) -> Verdict:
        rollout_id = f"{family.name}-{uuid.uuid4().hex}"
        async with slots:
            reply = await client.chat.completions.create(
                model=model, messages=list(item.messages), temperature=TEMPERATURE, max_tokens=family.max_tokens,
                extra_headers={"X-Rollout-Id": rollout_id, "X-Task-Id": item.item_id, "X-Agent-Name": family.name})
        text = reply.choices[0].message.content or ""
        return Verdict(family.name, item.item_id, rollout_id, family.score(item, text))

    try:
        return list(await asyncio.gather(*(one(item) for item in items for _ in range(group))))
    finally:
        await client.close()


class Complaints(logging.Handler):
    """The judge job's warnings (why a group was left unjudged), kept for the report."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


async def judge_all(database_url: str, engine_url: str, group: int) -> TrainerMetrics:
    """The trainer's judge job over every recorded rollout, its task groups judged CONCURRENT_GROUPS at a time."""
    metrics = TrainerMetrics()
    settings = TrainerSettings(database_url=database_url, upstreams=(engine_url,), metrics_port=None, reward="judge",
                               judge_url=f"{engine_url}/v1", judge_idle_s=0.1, judge_attempts=1,
                               judge_max_tokens=JUDGE_MAX_TOKENS)
    database = open_database(database_url)
    try:
        job = JudgeJob(settings, session_factory(database), metrics, group_size=group, group_timeout_s=0)
        await asyncio.sleep(0.5)  # judge_idle_s
        async with job.sessions() as session:
            candidates = await judging.idle_open_rollouts(session, utcnow() - timedelta(seconds=0.1), limit=10_000)
        slots = asyncio.Semaphore(CONCURRENT_GROUPS)

        async def judged(members) -> int:
            async with slots:
                return await job.judge_group(members)

        await asyncio.gather(*(judged(g) for g in ready_groups(candidates, group, 0, utcnow())))
    finally:
        await database.dispose()
    return metrics


async def judge_scores(database_url: str) -> dict[str, float]:
    database = open_database(database_url)
    try:
        async with session_factory(database)() as session:
            rows = await session.execute(select(Reward.rollout_id, Reward.value).where(Reward.reason == JUDGE_REASON))
            return {rollout_id: value for rollout_id, value in rows}
    finally:
        await database.dispose()


def pairwise(verdicts: list[Verdict]) -> tuple[float, int]:
    """Agreeing pairs (ties half) and the number of scorer-discordant pairs, within judged groups."""
    agree, pairs = 0.0, 0
    key = lambda v: v.item_id  # noqa: E731
    for _, members in itertools.groupby(sorted(verdicts, key=key), key=key):
        members = [v for v in members if v.judge is not None]
        for a, b in itertools.combinations(members, 2):
            if a.success == b.success:
                continue
            win, lose = (a, b) if a.success > b.success else (b, a)
            pairs += 1
            agree += 1.0 if win.judge > lose.judge else 0.5 if win.judge == lose.judge else 0.0
    return agree, pairs


def report(verdicts: list[Verdict], metrics: TrainerMetrics, seconds: dict[str, float], complaints: list[str],
           args) -> str:
    def outcome(name: str) -> int:
        return int(metrics.registry.get_sample_value("rlproxy_trainer_judge_groups_total", {"outcome": name}) or 0)

    lines = [f"# bench/judge_agreement.py --items {args.items} --group {args.group} --seed {args.seed}",
             f"# judge: the engine's base model (bundled SmolLM2-135M-Instruct), built-in rubric, temperature 0, "
             f"judge_attempts 1, judge_max_tokens {JUDGE_MAX_TOKENS}",
             f"# groups: judged {outcome('judged')}, bad_output {outcome('bad_output')}, "
             f"unreachable {outcome('unreachable')}, refused {outcome('refused')}, error {outcome('error')}",
             f"# sampling {seconds['sample']:.0f} s, judging {seconds['judge']:.0f} s",
             "family   rollouts  scorer-success  judged  judge-mean(success/failure)  pairwise-agreement (95% CI)"
             "  accuracy@0.5 vs majority"]
    for name in [*FAMILIES, "all"]:
        mine = [v for v in verdicts if name in ("all", v.family)]
        judged = [v for v in mine if v.judge is not None]
        success = sum(v.success >= 1.0 for v in mine) / len(mine)
        wins = [v.judge for v in judged if v.success >= 1.0]
        losses = [v.judge for v in judged if v.success < 1.0]
        means = "/".join(f"{sum(x) / len(x):.2f}" if x else "-" for x in (wins, losses))
        agree, pairs = pairwise(mine)
        if pairs:
            low, high = wilson(agree, pairs)
            pair_text = f"{agree / pairs:.0%} of {pairs} ({low:.0%}-{high:.0%})"
        else:
            pair_text = "no discordant pairs"
        if judged:
            right = sum((v.judge >= 0.5) == (v.success >= 1.0) for v in judged) / len(judged)
            share = sum(v.success >= 1.0 for v in judged) / len(judged)
            accuracy = f"{right:.0%} vs {max(share, 1 - share):.0%}"
        else:
            accuracy = "-"
        lines.append(f"{name:8} {len(mine):8}  {success:14.0%}  {len(judged):6}  {means:>27}  {pair_text:>30}"
                     f"  {accuracy}")
    lines += [f"# left unjudged: {line[:160]}" for line in complaints[:5]]
    return "\n".join(lines) + "\n"


async def measure(args, proxy: str, engine_url: str, database_url: str) -> str:
    async with httpx.AsyncClient() as http:
        model = (await http.get(f"{engine_url}/v1/models")).json()["data"][0]["id"]
    rng = random.Random(args.seed)
    began = time.monotonic()
    verdicts: list[Verdict] = []
    for family in FAMILIES.values():
        drawn = {item.item_id: item for item in family.sample("train", args.items * 3, rng)}  # distinct items
        items = list(drawn.values())[: args.items]
        verdicts += await sample(proxy, model, family, items, args.group)
    sampled = time.monotonic()
    complaints = Complaints()
    logging.getLogger("rlproxy.trainer").addHandler(complaints)
    metrics = await judge_all(database_url, engine_url, args.group)
    judged = time.monotonic()
    scores = await judge_scores(database_url)
    for verdict in verdicts:
        verdict.judge = scores.get(verdict.rollout_id)
    return report(verdicts, metrics, {"sample": sampled - began, "judge": judged - sampled}, complaints.lines, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=10, help="training items per family")
    parser.add_argument("--group", type=int, default=4, help="replies per item, judged together")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engine-url", help="a running engine serving the bundled model (else one is started)")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args()
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="judge-agreement-")))
        engine_url = args.engine_url
        if engine_url is None:
            port = free_port()
            engine_url = f"http://127.0.0.1:{port}"
            stack.enter_context(running(rlproxy_command("engine", "--port", str(port), *ENGINE_ARGS),
                                        f"{engine_url}/v1/models", timeout=900, log_path=workdir / "engine.log"))
        database_url = f"sqlite+aiosqlite:///{workdir / 'store.db'}"
        proxy_port = free_port()
        proxy = f"http://127.0.0.1:{proxy_port}"
        stack.enter_context(running(proxy_command(proxy_port, [engine_url], database_url, "--spool-path",
                                                  str(workdir / "spool.jsonl")), f"{proxy}/healthz", timeout=120,
                                    log_path=workdir / "proxy.log"))
        table = asyncio.run(measure(args, proxy, engine_url, database_url))
    print(table, end="")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table)


if __name__ == "__main__":
    main()
