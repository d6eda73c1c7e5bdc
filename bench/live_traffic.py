"""Live traffic that never waits for the trainer: the demo's calculator agent (examples/run_calculator.py) started
at a fixed rate, whatever the trainer is doing, for a fixed wall time, many tasks interleaved, against
`rlproxy serve` + `rlproxy train` as processes on Postgres; held-out success before and after, and what the
trainer did with the traffic (bench/training_accounting.py: trained, or dropped and why).

Measured in docs/learning.md ("Live traffic"); every run's lines are in bench/results/live_traffic.txt. A run is
about `--wall-s` plus two held-out evaluations (~1 min each on a 2-core CPU) and the engine-shared start.

    .venv/bin/python bench/live_traffic.py --engine-url http://127.0.0.1:8000 --multiples 1,3,10 \
        --corrections on,off --seeds 11,12,13 --wall-s 600

Rates are relative to what a busy trainer consumes (`--consumed-per-min`: rollouts per minute, which
bench/run_learning.py's accounting line prints for the unpaced run on the same machine): at 1x the traffic
arrives as fast as the trainer takes it, at 3x and 10x it runs ahead and the trainer sees calls of ever older
versions. Arrivals are open-loop (one every 60 / rate seconds, never waiting for an earlier one); past
`--max-in-flight` attempts running at once an arrival is shed and counted, as a saturated service would refuse
it, rather than delayed. `--interleave` tasks (8) are open at a time, each arrival an attempt of one of them,
so a task's `ATTEMPTS` attempts (its group) arrive among other tasks' attempts (issue 36's item 2) and within
about 25-100 arrivals of each other (spread over the whole stream, no group would be complete before the last
minutes).

At the end of the wall time new arrivals stop, attempts still running get `--drain-s` to finish, the trainer is
stopped (production does not wait for it to catch up: what it has not consumed by then is counted `unclaimed`),
and the version then serving is evaluated on the 48 held-out tasks. With `--catch-up-s`, the trainer is then
started again, as after a burst of traffic: it runs until every rewarded rollout is trained or dropped with a
reason (or that many seconds pass), and the held-out tasks are evaluated again. Result lines are appended to
bench/results/live_traffic.txt.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import math
import os
import random
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.learning_runs import cpu_model  # noqa: E402
from bench.run_learning import (  # noqa: E402
    ATTEMPTS, OLD_COMPUTATION, get, max_staleness, rlproxy_run, start_engine, start_proxy, success, write_tasks)
from bench.training_accounting import account  # noqa: E402
from demo.tasks import DEFAULT_FAMILY, FAMILIES, heldout_tasks, pool_size, train_tasks  # noqa: E402
from engine.model import prepare_model  # noqa: E402
from examples.run_calculator import solve  # noqa: E402
from runner.agents import ClientConfig  # noqa: E402
from runner.client import ProxyClient  # noqa: E402
from core.errors import RlproxyError  # noqa: E402
from testkit.processes import create_database, running, trainer_command  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "live_traffic.txt"
NO_KEY = "rlproxy"  # the proxy runs with keys off; clients insist on one


def stream(tasks, seed: int, interleave: int) -> list[dict]:
    """The order the traffic arrives in: `interleave` tasks open at a time, each arrival an attempt of one of them
    drawn at random; a task that has sent its ATTEMPTS attempts makes room for the next. Many tasks interleave,
    and a task's attempts (its group) arrive within about `interleave` x ATTEMPTS arrivals of each other, as
    they would from agents that each take a task for a while."""
    rng = random.Random(seed)
    waiting = [{"id": t.task_id, "prompt": t.prompt, "answer": t.answer, "tool": t.tool} for t in tasks]
    opened = [[task, ATTEMPTS] for task in waiting[:interleave]]
    waiting = waiting[interleave:]
    attempts = []
    while opened:
        place = rng.randrange(len(opened))
        attempts.append(opened[place][0])
        opened[place][1] -= 1
        if opened[place][1] == 0:
            opened.pop(place)
            if waiting:
                opened.append([waiting.pop(0), ATTEMPTS])
    return attempts


async def one_attempt(client: ProxyClient, task: dict) -> tuple[str | None, float | None]:
    """One attempt of the agent on its own rollout, the reward posted; (rollout id, reward), None on failure."""
    try:
        created = await client.create_rollout(task["id"], agent=None, evaluation=False, metadata={"live": True})
        config = ClientConfig(openai_base_url=created.base_url, anthropic_base_url=created.base_url.removesuffix("/v1"),
                              rollout_id=created.rollout_id, reward_url=f"{client.proxy}/reward",
                              event_url=f"{created.base_url.removesuffix('/v1')}/events", api_key=NO_KEY, model="auto",
                              task_id=task["id"], eval=False)
        reward = await solve(task, config)
        await client.post_reward(created.rollout_id, reward)
        return created.rollout_id, reward
    except (RlproxyError, openai.APIError, OSError, ValueError) as exc:  # the agent's own failure (an engine error, a bad reply)
        print(f"attempt of {task['id']} failed: {exc}", file=sys.stderr)
        return None, None


async def traffic(proxy: str, attempts: list[dict], rate_per_min: float, wall_s: float, max_in_flight: int,
                  drain_s: float) -> dict:
    """Open-loop arrivals for `wall_s` seconds; what arrived, ran, was shed, and the finished attempts."""
    client = ProxyClient(proxy, None)
    running_now: set[asyncio.Task] = set()
    finished: list[tuple[str | None, float | None]] = []
    shed = 0
    interval = 60.0 / rate_per_min
    began = time.monotonic()
    try:
        for index, task in enumerate(attempts):
            arrival = began + index * interval
            if arrival - began >= wall_s:
                break
            await asyncio.sleep(max(0.0, arrival - time.monotonic()))
            if len(running_now) >= max_in_flight:
                shed += 1
                continue
            job = asyncio.create_task(one_attempt(client, task))
            running_now.add(job)
            job.add_done_callback(lambda done: ended(done, running_now, finished))
        else:
            raise SystemExit("the task stream ran out before the wall time: raise --pool")
        await asyncio.sleep(max(0.0, began + wall_s - time.monotonic()))
        if running_now:
            _, late = await asyncio.wait(set(running_now), timeout=drain_s)
            for job in late:
                job.cancel()
    finally:
        await client.close()
    return {"arrived": index, "shed": shed, "finished": finished}


def ended(job: asyncio.Task, running_now: set[asyncio.Task], finished: list) -> None:
    running_now.discard(job)
    if not job.cancelled():  # one cut off at the end of the drain is not counted as finished
        finished.append(job.result())


def one_run(engine: str, postgres: str, multiple: float, consumed_per_min: float, seed: int, correction: str,
            wall_s: float, max_in_flight: int, drain_s: float, keep_logs: Path | None = None,
            family: str = DEFAULT_FAMILY, extra_set: tuple[str, ...] = (), interleave: int = 8,
            catch_up_s: float = 0.0) -> list[str]:
    started = time.monotonic()
    trainer_set = (list(OLD_COMPUTATION) if correction == "off" else []) + list(extra_set)
    rate = multiple * consumed_per_min
    pool = math.ceil(rate * wall_s / 60 / ATTEMPTS) + interleave
    with tempfile.TemporaryDirectory(prefix="live-traffic-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        database = create_database(postgres, "rlproxy_live_traffic")
        proxy = start_proxy(stack, engine, database, workdir)
        heldout = write_tasks(workdir / "heldout.jsonl", heldout_tasks(min(48, pool_size("heldout", family)),
                                                                      seed=0, family=family))
        before = success(rlproxy_run(proxy, "agent", workdir, "before", "--eval-tasks", str(heldout)))
        sets = [arg for pair in trainer_set for arg in ("--set", pair)]
        with ExitStack() as trainer:  # stopped when the wall time ends: the traffic never waited for it
            trainer.enter_context(running(trainer_command(database, engine, prepare_model(), workdir / "adapters",
                                                          *sets), None, log_path=workdir / "trainer.log"))
            ran = asyncio.run(traffic(proxy, stream(train_tasks(pool, seed=seed, family=family), seed, interleave), rate, wall_s,
                                      max_in_flight, drain_s))
        version = get(f"{proxy}/policies")["active"]
        rollout_ids = [rollout for rollout, reward in ran["finished"] if rollout and reward is not None]
        accounting = account(database, rollout_ids, max_staleness=max_staleness(trainer_set))
        after = success(rlproxy_run(proxy, "agent", workdir, "after", "--eval-tasks", str(heldout)))
        caught_up = None
        if catch_up_s > 0:  # the traffic has eased: a trainer started again takes what it had not consumed
            with running(trainer_command(database, engine, prepare_model(), workdir / "adapters", *sets), None,
                         log_path=workdir / "trainer.log"):
                waited = catch_up(database, rollout_ids, max_staleness(trainer_set), catch_up_s)
            caught_up = (waited, account(database, rollout_ids, max_staleness=max_staleness(trainer_set)),
                         get(f"{proxy}/policies")["active"],
                         success(rlproxy_run(proxy, "agent", workdir, "caught-up", "--eval-tasks", str(heldout))))
        if keep_logs is not None:
            keep_logs.mkdir(parents=True, exist_ok=True)
            for name in ("trainer.log", "proxy.log"):
                shutil.copy(workdir / name, keep_logs / f"{multiple:g}x-seed{seed}-{correction}-{name}")
    rewards = [reward for _, reward in ran["finished"] if reward is not None]
    return [(f"{family} {multiple:g}x ({rate:.1f} rollouts/min) seed {seed} correction {correction}: held-out success base "
             f"{before[0]}/{before[1]} -> v{version} {after[0]}/{after[1]} "
             f"({(after[0] / after[1] - before[0] / before[1]) * 100:+.1f} points); {ran['arrived']} arrived in "
             f"{wall_s:.0f} s, {ran['shed']} shed, {len(rewards)} rewarded (reward "
             f"{sum(rewards) / max(1, len(rewards)):.2f}); {time.monotonic() - started:.0f} s"),
            f"  trainer: {accounting.describe()}"] + ([] if caught_up is None else [catch_up_line(before, *caught_up)])


def catch_up(database: str, rollout_ids: list[str], staleness: int, most_s: float) -> float:
    """Seconds until every rewarded rollout is trained or dropped with a reason (none `unclaimed`), or `most_s`."""
    began = time.monotonic()
    while time.monotonic() - began < most_s:
        time.sleep(15)
        if not account(database, rollout_ids, max_staleness=staleness).rollouts["unclaimed"]:
            break
    return time.monotonic() - began


def catch_up_line(before: tuple[int, int], waited: float, accounting, version: int, after: tuple[int, int]) -> str:
    return (f"  after the traffic, the trainer again for {waited:.0f} s: held-out v{version} {after[0]}/{after[1]} "
            f"({(after[0] / after[1] - before[0] / before[1]) * 100:+.1f} points from base); {accounting.describe()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine-url", help="an engine already running (default: `rlproxy engine` is started)")
    parser.add_argument("--postgres", default=os.environ.get("RLPROXY_TEST_POSTGRES",
                                                             "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--multiples", default="1,3,10", help="traffic rates, as multiples of --consumed-per-min")
    parser.add_argument("--consumed-per-min", type=float, required=True,
                        help="rollouts a busy trainer consumes per minute on this machine (bench/run_learning.py "
                             "prints it for its unpaced run)")
    parser.add_argument("--corrections", default="on,off", help="on: the trainer's defaults; off: OLD_COMPUTATION")
    parser.add_argument("--seeds", default="11,12,13")
    parser.add_argument("--wall-s", type=float, default=600.0, help="seconds of traffic per run")
    parser.add_argument("--max-in-flight", type=int, default=64, help="attempts running at once; more are shed")
    parser.add_argument("--family", default=DEFAULT_FAMILY,
                        choices=sorted(FAMILIES), help="demo/tasks.py's task family (the demo's by default)")
    parser.add_argument("--trainer-set", action="append", default=[], metavar="NAME=VALUE",
                        help="a training setting for `rlproxy train --set` (repeat; after --corrections')")
    parser.add_argument("--interleave", type=int, default=8,
                        help="tasks whose attempts arrive interleaved at any time (see `stream`)")
    parser.add_argument("--keep-logs", type=Path, help="a folder to copy each run's trainer and proxy logs into")
    parser.add_argument("--drain-s", type=float, default=60.0, help="seconds running attempts get at the end")
    parser.add_argument("--catch-up-s", type=float, default=0.0,
                        help="after the held-out evaluation, start the trainer again for at most this long (until "
                             "no rewarded rollout is left unclaimed), then evaluate again: what the backlog gives "
                             "once traffic eases. 0: no catch-up")
    args = parser.parse_args()
    with ExitStack() as stack:
        engine = args.engine_url or start_engine(stack)
        for seed in (int(s) for s in args.seeds.split(",")):
            for multiple in (float(m) for m in args.multiples.split(",")):
                for correction in args.corrections.split(","):
                    lines = one_run(engine, args.postgres, multiple, args.consumed_per_min, seed, correction,
                                    args.wall_s, args.max_in_flight, args.drain_s, args.keep_logs, args.family,
                                    tuple(args.trainer_set), args.interleave, args.catch_up_s)
                    print("\n".join(lines), flush=True)
                    sets = (OLD_COMPUTATION if correction == "off" else ()) + tuple(args.trainer_set)
                    with RESULTS.open("a") as file:
                        file.write(f"## {datetime.date.today()} {cpu_model()}, {os.cpu_count()} cores: "
                                   f"bench/live_traffic.py --wall-s {args.wall_s:g} --consumed-per-min "
                                   f"{args.consumed_per_min:g} --family {args.family} --catch-up-s {args.catch_up_s:g} (correction {correction}: "
                                   f"trainer --set {' '.join(sets) or 'none, its defaults'})\n"
                                   + "\n".join(lines) + "\n\n")


if __name__ == "__main__":
    main()
