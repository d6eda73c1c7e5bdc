"""`rlproxy train` says at its start what it would make of the traffic already waiting (trainer/waiting.py): per
policy, how many of the waiting calls its steps would train and why the rest would not. Nothing is leased or
trained by saying so."""
from __future__ import annotations

import logging
import uuid

from core.settings import TrainerSettings, TrainingSettings
from store import rollouts as store_rollouts
from store import training
from store.calls import write_calls
from store.db import open_database, session_factory
from store.models import utcnow
from store.records import CallRecord, ChoiceRecord
from trainer.waiting import log_waiting_yield


async def waiting_group(sessions, task: str, sampling: str | None, rewards: list[float]) -> list[str]:
    """One rewarded rollout per reward, each with one call of the default policy."""
    made = []
    for reward in rewards:
        rollout_id = uuid.uuid4().hex
        call = CallRecord(id=uuid.uuid4().hex, route="chat", started_at=utcnow(), rollout_id=rollout_id,
                          agent="solver", task_id=task, policy_version=0, prompt_token_ids=[5, 6, 7],
                          sampling=sampling, logprobs_mode="processed",
                          choices=[ChoiceRecord(0, [8, 9], [-0.5, -0.7], "stop")])
        async with sessions() as session, session.begin():
            await write_calls(session, [call])
        async with sessions() as session, session.begin():
            await store_rollouts.post_reward(session, rollout_id, reward, task_id=task)
        made.append(rollout_id)
    return made


async def test_the_waiting_traffic_s_yield_is_one_line_per_policy_and_nothing_is_taken(own_database_url, caplog):
    caplog.set_level(logging.INFO, logger="rlproxy.trainer")
    database = open_database(own_database_url)
    sessions = session_factory(database)
    settings = TrainerSettings(database_url=own_database_url, metrics_port=None,
                               training=TrainingSettings(group_size=2))
    assert await log_waiting_yield(sessions, settings, {"default": 0}) == {}
    assert "no rewarded rollouts are waiting to be trained" in caplog.text
    await waiting_group(sessions, "learnable", None, [1.0, 0.0])
    await waiting_group(sessions, "greedy", "temperature=0", [1.0, 0.0])
    await waiting_group(sessions, "same", None, [0.5, 0.5])
    reports = await log_waiting_yield(sessions, settings, {"default": 0})
    assert reports["default"]["calls_trained"] == 2 and reports["default"]["calls_seen"] == 6
    assert reports["default"]["calls_skipped"] == {"greedy_sampling": 2, "zero_advantage": 2}
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting traffic")]
    assert line == ("waiting traffic, policy 'default': 2 of the 6 calls it answered in 6 rewarded rollouts would be "
                    "trained; not trained: greedy_sampling 2, zero_advantage 2")
    async with sessions() as session:
        assert await training.waiting_rollouts(session) == 6  # still waiting, none leased
        assert len(await training.ready_rollouts(session, limit=10, group_size=2, group_timeout_s=0.0)) == 6
    await database.dispose()
