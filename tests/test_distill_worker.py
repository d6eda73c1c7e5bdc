"""The trainer worker with `--teacher self` (real Postgres, the stand-in engine, a tiny random model): rollouts that
never got a reward are closed once their agent is silent and trained from the teacher's gap alone; a policy without
a teacher leaves them open."""
from __future__ import annotations

import asyncio
import math
import random
import time
import uuid

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select, update

from core.settings import TrainerSettings, TrainingSettings
from store.calls import write_calls
from store.db import open_database, session_factory
from store.models import Rollout, TrainStep, utcnow
from store.records import CallRecord, ChoiceRecord
from tests.conftest import TINY_VOCAB

pytest.importorskip("torch")


async def unrewarded_episodes(database_url: str, count: int) -> list[str]:
    """Calls as the proxy records them, and no reward ever posted."""
    rng = random.Random(1)
    database = open_database(database_url)
    ids = []
    try:
        for _ in range(count):
            rollout_id = uuid.uuid4().hex
            completion = [rng.randrange(3, TINY_VOCAB) for _ in range(5)] + [2]
            record = CallRecord(id=uuid.uuid4().hex, route="chat", started_at=utcnow(), rollout_id=rollout_id,
                                agent="solver", task_id="t", policy_version=0,
                                prompt_token_ids=[rng.randrange(3, TINY_VOCAB) for _ in range(10)],
                                choices=[ChoiceRecord(0, completion, [-1.0] * len(completion), "stop")])
            async with session_factory(database)() as session, session.begin():
                await write_calls(session, [record])
            ids.append(rollout_id)
    finally:
        await database.dispose()
    return ids


def test_silent_unrewarded_rollouts_train_a_taught_policy_only(tiny_model, own_database_url, stub_url, tmp_path):
    from trainer.worker import TrainerWorker

    rollout_ids = asyncio.run(unrewarded_episodes(own_database_url, 4))
    training = TrainingSettings(batch_rollouts=4, group_size=4, group_timeout_s=0, micro_batch_tokens=256, bf16=False)

    def settings(**teacher) -> TrainerSettings:
        return TrainerSettings(database_url=own_database_url, upstreams=(stub_url,), adapters_dir=tmp_path,
                               metrics_port=None, worker_id="distill", training=training, distillation=teacher)

    async def step(given: TrainerSettings):
        worker = TrainerWorker(given, tiny_model)
        await worker.start()
        try:
            return await worker.step_once(), worker
        finally:
            await worker.database.dispose()

    time.sleep(1.2)  # the agent's silence
    trained, _ = asyncio.run(step(settings()))
    assert not trained  # no teacher: the rollouts stay open, waiting for their reward
    trained, worker = asyncio.run(step(settings(teacher=("self",), teacher_idle_s=1.0)))
    assert trained and worker.metrics.steps._value.get() == 1

    async def stored():
        database = open_database(own_database_url)
        try:
            async with session_factory(database)() as session:
                rows = (await session.execute(select(Rollout).where(Rollout.id.in_(rollout_ids)))).scalars().all()
                return rows, (await session.execute(select(TrainStep))).scalars().all()
        finally:
            await database.dispose()

    rows, (step_row,) = asyncio.run(stored())
    assert all(r.status == "finished" and r.reward is None and r.trained_at is not None for r in rows)
    assert step_row.policy_version == 1 and step_row.metrics["transitions"] == 4
    # the step's record keeps the teacher gap beside the PPO figures
    assert math.isfinite(step_row.metrics["teacher_kl"]) and step_row.metrics["teacher"]["kl"] == step_row.metrics["teacher_kl"]
    exported = text_string_to_metric_families(generate_latest(worker.metrics.registry).decode())
    [gap] = [family for family in exported if family.name == "rlproxy_trainer_teacher_kl"]
    assert gap.samples[0].labels == {"policy": "default"} and math.isfinite(gap.samples[0].value)


def test_a_reward_after_the_rollout_was_closed_without_one_says_why_and_a_graded_one_waits(own_database_url):
    from datetime import timedelta

    from store.closing import close_idle
    from store.errors import Conflict
    from store.rollouts import post_reward

    [rollout_id, graded] = asyncio.run(unrewarded_episodes(own_database_url, 2))

    async def close_then_reward():
        database = open_database(own_database_url)
        try:
            async with session_factory(database)() as session, session.begin():  # its grader gives its reward
                await session.execute(update(Rollout).where(Rollout.id == graded).values(reward_source="grader"))
            async with session_factory(database)() as session, session.begin():
                assert await close_idle(session, utcnow() + timedelta(seconds=1), policies=["other"]) == []
                assert await close_idle(session, utcnow() + timedelta(seconds=1), policies=["default"]) == [rollout_id]
            async with session_factory(database)() as session, session.begin():
                await post_reward(session, rollout_id, 1.0)
        finally:
            await database.dispose()

    with pytest.raises(Conflict, match="closed without a final reward .*its agent was silent"):
        asyncio.run(close_then_reward())
