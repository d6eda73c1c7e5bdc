"""What the operator does while the trainer runs is kept: a rollback made during training is not undone by the
next publish, a version the operator activated while its gate ran is not retired by the gate, and a step whose
rollouts another trainer took is not recorded (so nothing is trained twice). Real Postgres, the stub engine (it
loads adapters like vLLM), a tiny random model."""
from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from core.settings import TrainerSettings, TrainingSettings
from engine import lifecycle
from store.db import open_database, session_factory
from store.models import Policy, Rollout, TrainStep, utcnow
from tests.episodes import record_episodes

torch = pytest.importorskip("torch")


def settings_for(database_url: str, stub_url: str, tmp_path) -> TrainerSettings:
    return TrainerSettings(database_url=database_url, upstreams=(stub_url,), adapters_dir=tmp_path,
                           metrics_port=None, worker_id="ops-trainer", drain_seconds=45,
                           training=TrainingSettings(batch_rollouts=8, group_size=4, micro_batch_tokens=512,
                                                     learning_rate=1e-3))


async def statuses(worker) -> dict[int, str]:
    async with worker.sessions() as session:
        return dict((await session.execute(select(Policy.version, Policy.status))).all())


async def steps(worker) -> list[TrainStep]:
    async with worker.sessions() as session:
        return list((await session.execute(select(TrainStep).order_by(TrainStep.id))).scalars())


def test_a_rollback_made_while_the_trainer_runs_is_followed_not_undone(tiny_model, own_database_url, stub_url,
                                                                        tmp_path):
    from trainer.worker import TrainerWorker

    async def scenario():
        await record_episodes(own_database_url, groups=2, group_size=4, task_prefix="first")
        worker = TrainerWorker(settings_for(own_database_url, stub_url, tmp_path), tiny_model)
        await worker.start()
        try:
            assert await worker.step_once() and await worker.step_once() is False
            assert (await statuses(worker))[1] == "active"
            # the operator rolls back to the base model (POST /policies/0/activate does this)
            await lifecycle.activate(worker.sessions, worker.publisher.adapters, 0)
            await record_episodes(own_database_url, groups=2, group_size=4, task_prefix="second", version=0)
            assert await worker.step_once()
            return await statuses(worker), await steps(worker), worker.lines["default"].parent_version
        finally:
            await worker.database.dispose()

    versions, recorded, parent = asyncio.run(scenario())
    assert versions[1] == "retired"  # the operator's rollback stands ...
    assert versions[2] == "active" and recorded[-1].policy_version == 2  # ... and v2 was trained from it
    assert parent == 2

    async def parent_of_v2():
        database = open_database(own_database_url)
        try:
            async with session_factory(database)() as session:
                return (await session.execute(select(Policy.parent_version).where(Policy.version == 2))).scalar_one()
        finally:
            await database.dispose()

    assert asyncio.run(parent_of_v2()) == 0


def test_a_rollback_during_a_step_leaves_the_trained_version_retired_and_the_rollback_serving(
        tiny_model, own_database_url, stub_url, tmp_path):
    """The operator rolls back while the step computes: the version it trained from v1 is declined, not made
    active over the operator's choice (before: activating it retired whatever was active)."""
    from trainer.worker import TrainerWorker

    async def scenario():
        await record_episodes(own_database_url, groups=2, group_size=4, task_prefix="first")
        worker = TrainerWorker(settings_for(own_database_url, stub_url, tmp_path), tiny_model)
        await worker.start()
        try:
            assert await worker.step_once()  # v1 active
            await record_episodes(own_database_url, groups=2, group_size=4, task_prefix="second", version=1)
            original = worker.policy.step

            def step_while_the_operator_rolls_back(*args, **kwargs):
                result = original(*args, **kwargs)
                asyncio.run_coroutine_threadsafe(
                    lifecycle.activate(worker.sessions, worker.publisher.adapters, 0), loop).result(60)
                return result

            loop = asyncio.get_running_loop()
            worker.policy.step = step_while_the_operator_rolls_back
            assert await worker.step_once()
            return (await statuses(worker), worker.metrics.publish_declined._value.get(),
                    worker.lines["default"].parent_version)
        finally:
            await worker.database.dispose()

    versions, declined, parent = asyncio.run(scenario())
    assert versions == {1: "retired", 2: "retired"} and declined == 1
    assert parent == 0  # the next step trains from what serves: the base model


def test_a_gate_does_not_retire_a_version_the_operator_activated_while_it_ran(tiny_model, own_database_url,
                                                                              stub_url, tmp_path):
    from trainer.worker import TrainerWorker

    async def scenario():
        await record_episodes(own_database_url, groups=2, group_size=4)

        async def gate(version: int) -> bool:  # slow evaluation; meanwhile the operator promotes it by hand
            await lifecycle.activate(worker.sessions, worker.publisher.adapters, version)
            return False

        worker = TrainerWorker(settings_for(own_database_url, stub_url, tmp_path), tiny_model, on_published=gate)
        await worker.start()
        try:
            assert await worker.step_once()
            return await statuses(worker), worker.lines["default"].parent_version
        finally:
            await worker.database.dispose()

    versions, parent = asyncio.run(scenario())
    assert versions == {1: "active"} and parent == 1  # before: retired, the policy left on the base model


def test_a_step_whose_rollouts_another_trainer_took_is_not_recorded(tiny_model, own_database_url, stub_url,
                                                                   tmp_path):
    """Two processes with the same worker id (the default): the second took the first's leases back at its start.
    The first's step ends without recording (an ALERT, a counter), so the rollouts are trained once."""
    from trainer.worker import TrainerWorker

    async def scenario():
        ids = await record_episodes(own_database_url, groups=2, group_size=4)
        worker = TrainerWorker(settings_for(own_database_url, stub_url, tmp_path), tiny_model)
        await worker.start()
        try:
            original = worker.policy.step

            def step_while_another_takes_the_batch(*args, **kwargs):
                result = original(*args, **kwargs)
                asyncio.run_coroutine_threadsafe(take(ids), loop).result(60)
                return result

            async def take(rollout_ids):
                async with worker.sessions() as session, session.begin():
                    await session.execute(update(Rollout).where(Rollout.id.in_(rollout_ids)).values(
                        lease_owner="ops-trainer:other", lease_expires_at=utcnow() + timedelta(minutes=5)))

            loop = asyncio.get_running_loop()
            worker.policy.step = step_while_another_takes_the_batch
            assert await worker.step_once()
            async with worker.sessions() as session:
                trained = (await session.execute(select(Rollout.trained_at).where(Rollout.id.in_(ids)))).scalars()
                untrained = sum(moment is None for moment in trained)
            return await steps(worker), await statuses(worker), untrained, worker.metrics.lost_leases._value.get()
        finally:
            await worker.database.dispose()

    recorded, versions, untrained, lost = asyncio.run(scenario())
    assert recorded == [] and versions == {} and untrained == 8 and lost == 1
