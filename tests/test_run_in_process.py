"""The runner in process (`runner.run.Runner`), as the demo, the bench and a user's own script call it: an agent
function over task dicts, or over a stream of attempts that waits and ends when the caller says; each finished
attempt handed to the caller; nothing drawn, no log file. Against the real proxy in front of the stand-in
engine (Postgres)."""
from __future__ import annotations

import asyncio
import json
import uuid

import pytest
import requests
from openai import AsyncOpenAI
from sqlalchemy import update

from core.settings import RunSettings
from examples.run_agent import solve_async
from runner.attempt import Attempt, Outcome
from runner.errors import ProxyRefused
from runner.run import Runner
from runner.tasks import EVAL, Task
from store.db import open_database, session_factory
from store.models import Rollout, utcnow
from tests.run_support import TASKS

TASK_DICTS = [json.loads(line) for line in TASKS.read_text().splitlines()[:3]]  # arithmetic with answers


def stored(proxy_url: str, rollout_id: str) -> dict:
    answer = requests.get(f"{proxy_url}/rollouts/{rollout_id}", timeout=10)
    answer.raise_for_status()
    return answer.json()


def test_an_agent_function_over_task_dicts_in_groups_each_attempt_told_to_the_caller(
        proxy_url, tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)  # where `rlproxy run` would write its log
    seen: list[Outcome] = []

    async def main() -> tuple[list[Outcome], list[Outcome]]:
        settings = RunSettings(proxy=proxy_url, attempts=3, concurrency=4, task_id_field="id", agent_name="calc")
        async with Runner(solve_async, settings, on_attempt=seen.append) as runner:
            trained = await runner.run(TASK_DICTS)
            measured = await runner.run(TASK_DICTS[:2], evaluation=True)
        return trained, measured

    trained, measured = asyncio.run(main())
    assert len(trained) == 9 and len(measured) == 2 and seen == trained + measured
    groups = sorted((o.attempt.task.id, o.attempt.number) for o in trained)
    assert groups == [(task["id"], n) for task in sorted(TASK_DICTS, key=lambda t: t["id"]) for n in range(3)]
    assert {o.status for o in seen} == {"rewarded"} and len({o.rollout_id for o in seen}) == 11
    for outcome in seen:
        rollout = stored(proxy_url, outcome.rollout_id)
        assert rollout["reward"] == outcome.reward and rollout["agent"] == "calc"
        assert rollout["task_id"] == outcome.attempt.task.id and rollout["eval"] == (outcome.split == EVAL)
        assert outcome.policies == tuple(call["policy"] for call in rollout["calls"]) == (0,)
    assert {o.split for o in measured} == {EVAL}
    assert list(tmp_path.iterdir()) == []  # no log file unless one is asked for
    assert capfd.readouterr().err == ""  # and no progress drawn: the caller shows the attempts its own way


def test_a_stream_of_attempts_that_waits_and_ends_when_the_caller_says(proxy_url):
    """The demo's shape: groups drawn one at a time, now and then a probe under another agent name as an
    evaluation rollout, a pause the caller holds (the trainer computing), and a stop after which the attempts
    in flight finish and no new one starts."""
    may_run, stop = asyncio.Event(), asyncio.Event()
    in_flight, most = 0, 0

    async def agent(task: dict, config) -> float:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        try:
            async with AsyncOpenAI(base_url=config.openai_base_url, api_key=config.api_key) as client:
                await client.chat.completions.create(model=config.model, max_tokens=4,
                                                     messages=[{"role": "user", "content": task["question"]}])
            return 1.0
        finally:
            in_flight -= 1

    async def attempts():
        for group in range(100):
            await may_run.wait()
            probe = group % 2 == 1
            for number in range(1 if probe else 4):
                if stop.is_set():
                    return
                yield (Attempt(Task(f"probe-{group}", TASK_DICTS[0], EVAL), group, agent_name="probe") if probe
                       else Attempt(Task(f"train-{group}", TASK_DICTS[group % 3]), group, number))

    ended: list[Outcome] = []

    def finished(outcome: Outcome) -> None:
        ended.append(outcome)
        if len(ended) == 6:
            stop.set()

    async def main() -> None:
        async with Runner(agent, RunSettings(proxy=proxy_url, concurrency=3, agent_name="trainee"),
                          on_attempt=finished) as runner:
            running = asyncio.create_task(runner.run_attempts(attempts()))
            await asyncio.sleep(0.5)
            assert not ended and not running.done()  # held until the caller lets it run
            may_run.set()
            assert await running == ended

    asyncio.run(main())
    assert 6 <= len(ended) <= 6 + 2 and most <= 3  # the two others in flight when it stopped, no new one
    assert {o.status for o in ended} == {"rewarded"}
    probes = [o for o in ended if o.split == EVAL]
    assert [o.attempt.task.id for o in probes] == ["probe-1"]
    rollout = stored(proxy_url, probes[0].rollout_id)
    assert (rollout["agent"], rollout["eval"]) == ("probe", True)
    assert stored(proxy_url, ended[0].rollout_id)["agent"] == "trainee"


def test_failures_are_outcomes_and_a_proxy_that_does_not_answer_is_refused(proxy_url):
    def broken(task: dict, config) -> float:
        raise ValueError("the agent's own bug")

    async def main() -> list[Outcome]:
        async with Runner(broken, RunSettings(proxy=proxy_url, attempts=2)) as runner:
            return await runner.run(TASK_DICTS[:1])

    outcomes = asyncio.run(main())
    assert [(o.status, o.reward, o.tries) for o in outcomes] == [("failed", None, 1)] * 2
    assert all("the agent's own bug" in o.error for o in outcomes)

    async def unreachable() -> None:
        async with Runner(broken, RunSettings(proxy="http://127.0.0.1:9")):
            pass

    with pytest.raises(ProxyRefused, match="does not answer"):
        asyncio.run(unreachable())
    with pytest.raises(ValueError, match="draws its own progress"):
        Runner(broken, on_attempt=print, progress=True)


async def mark_trained(database_url: str, rollout_ids: list[str]) -> None:
    """What the trainer does to the rollouts it consumed, done by hand so that a wait for it shows."""
    store = open_database(database_url)
    try:
        async with session_factory(store)() as session, session.begin():
            await session.execute(update(Rollout).where(Rollout.id.in_(rollout_ids)).values(trained_at=utcnow()))
    finally:
        await store.dispose()


def test_with_max_untrained_a_training_attempt_waits_until_the_trainer_has_consumed_earlier_ones(
        proxy_url, database_url):
    """At most two training attempts running or waiting for the trainer: the third starts only once the first two
    are trained. What the trainer does to them (mark them trained) is done here by hand, so the wait shows."""
    seen: list[Outcome] = []

    async def main() -> list[Outcome]:
        settings = RunSettings(proxy=proxy_url, attempts=4, concurrency=4, task_id_field="id", max_untrained=2)
        async with Runner(solve_async, settings, on_attempt=seen.append) as runner:
            run = asyncio.create_task(runner.run([{**TASK_DICTS[0], "id": f"paced-{uuid.uuid4().hex}"}]))
            while len(seen) < 2:
                await asyncio.sleep(0.05)
            await asyncio.sleep(2.5)  # the stand-in answers in milliseconds: a third attempt would have ended
            assert len(seen) == 2 and not run.done()
            await mark_trained(database_url, [outcome.rollout_id for outcome in seen])
            return await asyncio.wait_for(run, 30)

    outcomes = asyncio.run(main())
    assert [o.status for o in outcomes] == ["rewarded"] * 4
    assert sorted(o.attempt.number for o in outcomes) == [0, 1, 2, 3]


def test_a_resumed_run_counts_the_earlier_runs_untrained_rewards_against_max_untrained(
        proxy_url, database_url, tmp_path):
    """The first run's two rewarded attempts have not been trained when the run is resumed with four attempts and
    --max-untrained 2: the two new attempts wait for the trainer as they would have in one run, rather than start
    at once beside two untrained rewards."""
    task = {**TASK_DICTS[0], "id": f"resumed-{uuid.uuid4().hex}"}
    log = tmp_path / "run.jsonl"

    async def first() -> list[Outcome]:
        settings = RunSettings(proxy=proxy_url, attempts=2, task_id_field="id")
        async with Runner(solve_async, settings, log=log) as runner:
            return await runner.run([task])

    earlier = asyncio.run(first())
    assert [o.status for o in earlier] == ["rewarded"] * 2
    seen: list[Outcome] = []

    async def resumed() -> list[Outcome]:
        settings = RunSettings(proxy=proxy_url, attempts=4, concurrency=4, task_id_field="id", max_untrained=2,
                               resume=True)
        async with Runner(solve_async, settings, log=log, on_attempt=seen.append) as runner:
            run = asyncio.create_task(runner.run([task]))
            await asyncio.sleep(2.5)  # the stand-in answers in milliseconds: an attempt let in would have ended
            assert seen == [] and not run.done()
            await mark_trained(database_url, [outcome.rollout_id for outcome in earlier])
            return await asyncio.wait_for(run, 30)

    outcomes = asyncio.run(resumed())
    assert sorted((o.status, o.attempt.number) for o in outcomes) == [
        ("rewarded", 2), ("rewarded", 3), ("skipped", 0), ("skipped", 1)]
