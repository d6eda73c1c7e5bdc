"""The trainer worker against real Postgres and a real engine process (the stub, which loads adapters like
vLLM), on a tiny random model: claim → transitions → PPO step → adapter → publish → the proxy serves it."""
from __future__ import annotations

import asyncio
import json
import random
import re
import uuid
from pathlib import Path

import pytest
import requests
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from core.settings import TrainerSettings, TrainingSettings
from store.calls import write_calls
from store.db import open_database, session_factory
from store.models import Policy, Rollout, TrainStep, utcnow
from store.records import CallRecord, ChoiceRecord
from tests.episodes import record_episodes
from tests.support import running_proxy

torch = pytest.importorskip("torch")


def test_a_step_trains_marks_rollouts_and_the_proxy_serves_the_new_version(
        tiny_model, own_database_url, stub_url, tmp_path):
    from trainer.worker import TrainerWorker

    rollout_ids = asyncio.run(record_episodes(own_database_url, groups=2, group_size=4))
    settings = TrainerSettings(database_url=own_database_url, upstreams=(stub_url,), adapters_dir=tmp_path,
                               metrics_port=None, worker_id="test-trainer", drain_seconds=45,
                               training=TrainingSettings(batch_rollouts=8, group_size=4, micro_batch_tokens=512,
                                                         learning_rate=1e-3))

    async def one_step():
        worker = TrainerWorker(settings, tiny_model)
        await worker.start()
        try:
            return await worker.step_once(), await worker.step_once(), worker
        finally:
            await worker.database.dispose()

    trained, nothing_left, worker = asyncio.run(one_step())
    assert trained and not nothing_left
    assert worker.metrics.steps._value.get() == 1
    assert worker.publisher.drain.drain_seconds == 45  # the setting, not a number of the publisher's own
    # the throughput gauge as Prometheus scrapes it: the step's measured tokens per second, not the unset 0
    exported = text_string_to_metric_families(generate_latest(worker.metrics.registry).decode())
    [throughput] = [family for family in exported if family.name == "rlproxy_trainer_tokens_per_second"]
    assert throughput.samples[0].value > 0

    async def stored():
        database = open_database(own_database_url)
        async with session_factory(database)() as session:
            policies = (await session.execute(select(Policy))).scalars().all()
            marked = (await session.execute(select(Rollout.trained_at).where(Rollout.id.in_(rollout_ids)))).scalars()
            steps = (await session.execute(select(TrainStep))).scalars().all()
            result = policies, list(marked), steps
        await database.dispose()
        return result

    policies, marked, steps = asyncio.run(stored())
    [policy] = policies
    assert (policy.version, policy.status) == (1, "active")
    assert re.fullmatch(r"rlproxy-v1-[0-9a-f]{8}", policy.name)  # the adapter name its row keeps
    assert all(moment is not None for moment in marked)
    [step] = steps
    assert step.rollout_count == 8 and step.policy_version == 1 and step.metrics["transitions"] > 0
    adapter = json.loads((Path(policy.path) / "adapter_config.json").read_text())
    assert adapter["r"] == settings.training.lora_rank

    served = {m["id"]: m["parent"] for m in requests.get(f"{stub_url}/v1/models").json()["data"]}
    assert served[policy.name] == "stub-model"

    with running_proxy([stub_url], own_database_url, tmp_path) as proxy:
        answer = requests.post(f"{proxy}/v1/chat/completions",
                               json={"model": "stub-model", "messages": [{"role": "user", "content": "hi"}]})
        assert answer.headers["X-Rlproxy-Policy"] == "1"
        assert answer.json()["model"] == "stub-model"  # the agent still sees the name it asked for
        assert requests.get(f"{proxy}/policies").json()["active"] == 1
        rolled_back = requests.post(f"{proxy}/policies/0/activate")
        assert rolled_back.status_code == 200
        answer = requests.post(f"{proxy}/v1/chat/completions",
                               json={"model": "stub-model", "messages": [{"role": "user", "content": "hi"}]})
        assert answer.headers["X-Rlproxy-Policy"] == "0"


def test_stale_calls_are_trained_up_to_the_bound_and_the_rest_counted_by_lag(
        tiny_model, own_database_url, stub_url, tmp_path):
    """v10 serves; traffic that v4 (6 versions behind) and v1 (9 behind) sampled is still waiting. max_staleness 8:
    v4's calls are trained (with the importance weight), v1's dropped, and the step says so, by lag, in its record
    and its metrics; a rollout whose calls were all dropped is not counted a second time."""
    from store import policies as store_policies
    from trainer.worker import TrainerWorker

    async def versions_served_before():
        db = open_database(own_database_url)
        async with session_factory(db)() as session, session.begin():
            for version in range(1, 11):  # no adapter folders: the trainer starts v10's line from the base model
                await store_policies.add_candidate(session, version, "", parent_version=version - 1,
                                                   base_model=str(tiny_model))
                await store_policies.activate(session, version)
        await db.dispose()

    asyncio.run(versions_served_before())
    asyncio.run(record_episodes(own_database_url, groups=1, group_size=4, task_prefix="old", version=4))
    asyncio.run(record_episodes(own_database_url, groups=1, group_size=4, task_prefix="older", version=1))
    settings = TrainerSettings(database_url=own_database_url, upstreams=(stub_url,), adapters_dir=tmp_path,
                               metrics_port=None, worker_id="stale-trainer",
                               training=TrainingSettings(batch_rollouts=8, group_size=4, micro_batch_tokens=512))

    async def one_step():
        worker = TrainerWorker(settings, tiny_model)
        await worker.start()
        try:
            assert await worker.step_once()
            async with worker.sessions() as session:
                [step] = (await session.execute(select(TrainStep))).scalars().all()
            return worker, step
        finally:
            await worker.database.dispose()

    worker, step = asyncio.run(one_step())
    assert step.policy_version == 11 and step.transition_count == 4  # v4's four two-turn episodes, merged
    assert step.metrics["skipped"] == {"stale_policy": 8}  # v1's four episodes of two calls, nothing else
    assert step.metrics["staleness"]["trained_by_lag"] == {"6": 8}
    assert step.metrics["staleness"]["dropped_by_lag"] == {"9": 8}
    assert step.metrics["off_policy_kl"] != 0.0  # the engine's log-probs (-1.0) are not the trainer's
    m = worker.metrics
    assert m.skipped.labels("stale_policy")._value.get() == 8
    assert m.dropped_call_lag._sum.get() == 8 * 9 and m.trained_call_lag._sum.get() == 8 * 6


def test_ready_rollouts_takes_whole_groups_and_waits_for_a_fuller_batch(own_database_url):
    from store import training

    asyncio.run(record_episodes(own_database_url, groups=2, group_size=4))
    asyncio.run(record_episodes(own_database_url, groups=1, group_size=3, task_prefix="late"))  # still filling

    async def ready(**kwargs) -> list[str]:
        database = open_database(own_database_url)
        async with session_factory(database)() as session:
            chosen = await training.ready_rollouts(session, group_size=4, **kwargs)
        await database.dispose()
        return chosen

    assert len(asyncio.run(ready(limit=16, group_timeout_s=300))) == 8  # two full groups; the third waits
    assert len(asyncio.run(ready(limit=4, group_timeout_s=300))) == 4  # whole groups only, up to the limit
    assert asyncio.run(ready(limit=16, group_timeout_s=300, batch_timeout_s=60)) == []  # worth waiting for more
    assert len(asyncio.run(ready(limit=8, group_timeout_s=300, batch_timeout_s=60))) == 8  # a full batch goes
    assert len(asyncio.run(ready(limit=16, group_timeout_s=0, batch_timeout_s=0))) == 11  # late group as it is


def test_complete_groups_are_found_among_many_interleaved_tasks(own_database_url):
    """Live traffic interleaves tasks: twelve tasks' attempts arrive in turn, so the oldest rollouts hold three
    attempts of every task and no complete group. Once two tasks have their fourth attempt, a batch of two
    complete groups is ready at once, wherever they are in the queue (no group timeout waited for)."""
    from store import training

    async def attempt(task: int) -> str:
        [rollout_id] = await record_episodes(own_database_url, groups=1, group_size=1, task_prefix=f"t{task}",
                                             calls=1)
        return rollout_id

    async def ready() -> list[str]:
        database = open_database(own_database_url)
        async with session_factory(database)() as session:
            chosen = await training.ready_rollouts(session, limit=8, group_size=4, group_timeout_s=300)
        await database.dispose()
        return chosen

    attempts: dict[int, list[str]] = {task: [] for task in range(12)}
    for _ in range(3):
        for task in range(12):
            attempts[task].append(asyncio.run(attempt(task)))
    assert asyncio.run(ready()) == []  # 36 rollouts waiting, no group complete: nothing to train yet
    attempts[7].append(asyncio.run(attempt(7)))
    assert asyncio.run(ready()) == attempts[7]  # one complete group is a step (batch_timeout_s is 0)
    attempts[3].append(asyncio.run(attempt(3)))
    attempts[5].append(asyncio.run(attempt(5)))
    # at most 8: two whole groups, those whose first attempt came first (task 7's waits for the next step)
    chosen = asyncio.run(ready())
    assert len(chosen) == 8 and set(chosen) == set(attempts[3]) | set(attempts[5])


def claimable(database_url: str, **kwargs) -> list[str]:
    """What the trainer's claim would take now (store.training.ready_rollouts with these arguments)."""
    from store import training

    async def ready() -> list[str]:
        database = open_database(database_url)
        async with session_factory(database)() as session:
            chosen = await training.ready_rollouts(session, **kwargs)
        await database.dispose()
        return chosen
    return asyncio.run(ready())


def test_a_backlog_of_complete_groups_is_taken_in_one_larger_step(own_database_url):
    """Traffic ran ahead of the trainer: five complete groups of 4 wait where a batch is 8. A step takes them up to
    `most` (whole groups), with the updates its batches would have had; `most` equal to the batch keeps steps as
    they were, and an unfinished group is not pulled in by the larger claim."""
    asyncio.run(record_episodes(own_database_url, groups=5, group_size=4))
    asyncio.run(record_episodes(own_database_url, groups=1, group_size=3, task_prefix="late"))  # still filling

    def ready(**kwargs) -> list[str]:
        return claimable(own_database_url, limit=8, group_size=4, group_timeout_s=300, **kwargs)

    assert len(ready()) == 8  # one batch, as before
    assert len(ready(most=8)) == 8
    assert len(ready(most=12)) == 12  # three whole groups fit under 12
    assert len(ready(most=64)) == 20  # the whole backlog; the late group still waits
    settings = TrainingSettings(batch_rollouts=16, max_batch_rollouts=64, mini_batches=4)
    assert [settings.updates_for(n) for n in (8, 16, 20, 30, 64)] == [4, 4, 4, 8, 16]
    assert [settings.updates_for(n) for n in (24, 40)] == [8, 12]  # 1.5 and 2.5 batches: halves up, not to even
    assert TrainingSettings(batch_rollouts=128).step_rollouts_cap == 128  # never below the batch


def test_one_tasks_backlog_is_capped_too(own_database_url):
    """A task id reused for many attempts (20 waiting, groups of 4): a step takes whole groups of it up to the cap."""
    asyncio.run(record_episodes(own_database_url, groups=1, group_size=20))

    def ready(**kwargs) -> list[str]:
        return claimable(own_database_url, limit=8, group_size=4, group_timeout_s=300, **kwargs)

    assert len(ready()) == 8
    assert len(ready(most=10)) == 8  # whole groups of 4 under 10
    assert len(ready(most=64)) == 20


def test_rollouts_created_for_an_agent_that_is_not_trained_are_never_claimed(own_database_url):
    """An evaluation agent's rollouts (the demo's held-out probes, say) share the store but are not training data."""
    from sqlalchemy import update

    from store import training

    asyncio.run(record_episodes(own_database_url, groups=1, group_size=4))
    probes = asyncio.run(record_episodes(own_database_url, groups=1, group_size=4, task_prefix="probe"))

    async def work() -> tuple[list[str], list[str], int, int]:
        database = open_database(own_database_url)
        async with session_factory(database)() as session, session.begin():
            await session.execute(update(Rollout).where(Rollout.id.in_(probes)).values(agent="evaluator"))
        async with session_factory(database)() as session:
            trained_only = await training.ready_rollouts(session, limit=16, group_size=4, group_timeout_s=300,
                                                         agents=["solver"])
            everything = await training.ready_rollouts(session, limit=16, group_size=4, group_timeout_s=300)
            waiting = (await training.waiting_rollouts(session, ["solver"]), await training.waiting_rollouts(session))
        await database.dispose()
        return trained_only, everything, *waiting

    trained_only, everything, waiting_for_solver, waiting_at_all = asyncio.run(work())
    assert len(trained_only) == 4 and not set(trained_only) & set(probes)  # rollouts without an agent still qualify
    assert set(probes) <= set(everything)  # with no agents named, every agent is trained
    assert (waiting_for_solver, waiting_at_all) == (4, 8)


def test_calls_on_a_rollouts_plain_base_url_belong_to_the_rollouts_agent(own_database_url):
    """`POST /rollouts {"agent": "demo"}` then calls on its `/rollouts/{id}/v1`: trained as agent "demo"."""
    from store import training
    from store.training import load_rollouts
    from trainer.batch import build_transitions
    from trainer.transitions import SkipReasons

    ids = asyncio.run(record_episodes(own_database_url, groups=1, group_size=4, call_agent=None,
                                      rollout_agent="demo"))

    async def load():
        database = open_database(own_database_url)
        async with session_factory(database)() as session:
            ready = await training.ready_rollouts(session, limit=8, group_size=4, group_timeout_s=300,
                                                  agents=["demo"])
            loaded = await load_rollouts(session, ids)
        await database.dispose()
        return ready, loaded

    ready, rollouts = asyncio.run(load())
    assert sorted(ready) == sorted(ids)
    assert {call.agent for r in rollouts for call in r.calls} == {"demo"}
    skips = SkipReasons()
    transitions = build_transitions(rollouts, TrainingSettings(train_agents=["demo"]), 0, skips)
    assert transitions and "agent_not_trained" not in skips


def test_adapters_reach_an_engine_that_wants_a_key_only_with_the_key(own_database_url, tmp_path):
    """Engines behind `--api-key`: the trainer sends RLPROXY_UPSTREAM_API_KEY; without it the load is refused
    and the version is marked failed rather than served. A same-named adapter already on the engine is
    replaced, not taken for ours."""
    from store import policies
    from tests.support import free_port, running, stub_command
    from trainer.publish import Publisher

    def adapter_folder(name: str) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "adapter_config.json").write_text("{}")
        (folder / "adapter_model.safetensors").write_bytes(b"")
        return folder

    stale, ours = adapter_folder("elsewhere"), adapter_folder("ours")
    port = free_port()
    engine = f"http://127.0.0.1:{port}"
    auth = {"Authorization": "Bearer engine-secret"}

    async def candidate(version: int) -> str:
        """The version's row; returns the adapter name it keeps."""
        db = open_database(own_database_url)
        async with session_factory(db)() as session, session.begin():
            name = (await policies.add_candidate(session, version, str(ours), parent_version=0,
                                                 base_model="m", metrics={})).name
        await db.dispose()
        return name

    async def publish(version: int, key: str | None):
        db = open_database(own_database_url)
        sessions = session_factory(db)
        published = await Publisher(sessions, [engine], attempts=1, api_key=key).publish(version, str(ours))
        async with sessions() as session:
            status = (await session.get(Policy, version)).status
        await db.dispose()
        return published, status

    with running(stub_command(port) + ["--api-key", "engine-secret"], engine + "/health"):
        asyncio.run(candidate(1))
        refused, refused_status = asyncio.run(publish(1, None))
        v2 = asyncio.run(candidate(2))
        # an adapter of v2's name with other weights already on the engine (a copy a stopped process left)
        left = requests.post(engine + "/v1/load_lora_adapter", headers=auth,
                             json={"lora_name": v2, "lora_path": str(stale)})
        assert left.status_code == 200
        loaded, loaded_status = asyncio.run(publish(2, "engine-secret"))
        models = requests.get(engine + "/v1/models", headers=auth).json()
    assert refused.error is not None and "401" in refused.error and refused_status == "failed"
    assert loaded.error is None and loaded.activated and loaded_status == "active"
    assert {m["id"]: m["root"] for m in models["data"]}[v2] == str(ours)  # replaced in place


def test_a_batch_the_step_cannot_digest_is_tried_once_more_then_set_aside_and_training_goes_on(
        tiny_model, own_database_url, tmp_path):
    """A defect in the step (here: one planted for the first two tries) used to stop `rlproxy train`, and the
    batch came back after every restart. Now: released once, set aside with its reason the second time, recorded
    as a step that trained nothing; the next batch trains."""
    from trainer.worker import TrainerWorker

    first = asyncio.run(record_episodes(own_database_url, groups=2, group_size=4, task_prefix="poison"))
    settings = TrainerSettings(database_url=own_database_url, upstreams=(), adapters_dir=tmp_path, metrics_port=None,
                               worker_id="test-trainer", training=TrainingSettings(batch_rollouts=8, group_size=4,
                                                                                   micro_batch_tokens=512))

    async def run():
        worker = TrainerWorker(settings, tiny_model)
        await worker.start()
        real_step, tries = worker.policy.step, []

        def failing_step(transitions, *args):
            tries.append(len(transitions))
            if len(tries) <= 2:
                raise ValueError("an index past the vocabulary")
            return real_step(transitions, *args)

        worker.policy.step = failing_step
        try:
            outcomes = [await worker.step_once(), await worker.step_once()]
            async with worker.sessions() as session:
                rows = (await session.execute(select(Rollout.id, Rollout.trained_at, Rollout.lease_owner)
                                              .where(Rollout.id.in_(first)))).all()
                steps = (await session.execute(select(TrainStep).order_by(TrainStep.id))).scalars().all()
            later = await record_episodes(own_database_url, groups=2, group_size=4, task_prefix="healthy")
            outcomes.append(await worker.step_once())
            return outcomes, rows, steps, later, worker, tries
        finally:
            await worker.database.dispose()

    outcomes, rows, steps, later, worker, tries = asyncio.run(run())
    assert outcomes == [True, True, True] and len(tries) == 3
    assert all(trained is not None and owner is None for _, trained, owner in rows)  # set aside, not leased
    [failed] = [step for step in steps if step.metrics.get("failed")]
    assert failed.policy_version is None and failed.rollout_count == 8
    assert failed.metrics["failed"] == "ValueError: an index past the vocabulary"
    assert failed.metrics["skipped"] == {"step_failed": 8}
    assert worker.steps == 1  # the healthy batch trained, from the adapter as it was before the failures


def test_a_rollout_waits_settle_s_after_its_reward_and_a_call_stored_after_training_is_counted_late(
        own_database_url):
    """With several proxies the reward can reach one while another still holds the rollout's last calls: the claim
    leaves a rollout alone for `settle_s` after it finished, and a call that lands in a trained rollout anyway is
    reported (WrittenCall.late: the writer counts it in rlproxy_capture_late_calls_total)."""
    from store import training

    ids = asyncio.run(record_episodes(own_database_url, groups=1, group_size=4, task_prefix="settling"))
    assert claimable(own_database_url, limit=4, group_size=4, group_timeout_s=300, settle_s=60) == []
    assert sorted(claimable(own_database_url, limit=4, group_size=4, group_timeout_s=300, settle_s=0)) == sorted(ids)

    async def train_then_write_one_more() -> list[bool]:
        database = open_database(own_database_url)
        sessions = session_factory(database)
        async with sessions() as session, session.begin():
            await training.record_step(session, ids, "trainer", policy_version=None, transition_count=0, metrics={})
        straggler = CallRecord(id=uuid.uuid4().hex, route="chat", started_at=utcnow(), rollout_id=ids[0],
                               agent="solver", task_id="settling-0", policy_version=0, prompt_token_ids=[5, 6],
                               choices=[ChoiceRecord(0, [7, 2], [-1.0, -1.0], "stop")])
        async with sessions() as session, session.begin():
            written = await write_calls(session, [straggler])
        await database.dispose()
        return [item.late for item in written]

    assert asyncio.run(train_then_write_one_more()) == [True]
