"""Rollouts whose final reward never comes: after the trainer's reward TTL they are `expired` — visible in
`GET /rollouts/{id}` and the trainer's metrics, never trained on, and a reward that arrives later is refused
with 409 rather than trained as if it had come in time. `rlproxy serve` and `rlproxy train` run as processes
on Postgres, in front of the stand-in engine."""
from __future__ import annotations

import asyncio
import re
import subprocess
import time
from datetime import timedelta

import openai
import pytest
import requests

from store.db import open_database, session_factory
from store.models import Rollout, utcnow
from store.rollouts import create_rollout, expire_open_rollouts, post_reward
from tests.support import free_port, running, running_proxy, stub_command, trainer_command

TTL_S = 3.0


def test_an_unrewarded_rollout_expires_and_a_late_reward_is_refused(tiny_model, own_database_url, tmp_path):
    engine_port, metrics_port = free_port(), free_port()
    engine = f"http://127.0.0.1:{engine_port}"
    with (running(stub_command(engine_port), engine + "/health", log_path=tmp_path / "stub.log"),
          running_proxy([engine], own_database_url, tmp_path) as proxy):
        forgotten = requests.post(f"{proxy}/rollouts", json={"task_id": "t1"}).json()
        rewarded = requests.post(f"{proxy}/rollouts", json={"task_id": "t1"}).json()
        for rollout in (forgotten, rewarded):
            agent = openai.OpenAI(base_url=rollout["base_url"], api_key="unused", max_retries=0)
            agent.chat.completions.create(model="stub-model", messages=[{"role": "user", "content": "hi"}])
        assert requests.post(f"{proxy}/reward", json={"rollout_id": rewarded["rollout_id"], "reward": 1}).ok

        command = trainer_command(own_database_url, engine, tiny_model, tmp_path / "adapters", "--reward-ttl-s",
                                  str(TTL_S), "--poll-interval", "0.2", metrics_port=metrics_port)
        with open(tmp_path / "trainer.log", "wb") as log:
            trainer = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                status = _wait_for_status(proxy, forgotten["rollout_id"], "expired", timeout=180)
                metrics = requests.get(f"http://127.0.0.1:{metrics_port}/metrics").text
            finally:
                trainer.terminate()
                trainer.wait(60)
        late = requests.post(f"{proxy}/reward", json={"rollout_id": forgotten["rollout_id"], "reward": 1})
        kept = requests.get(f"{proxy}/rollouts/{rewarded['rollout_id']}").json()

    assert status["reward"] is None and status["trained"] is False and status["finished_at"]
    assert len(status["calls"]) == 1  # what was recorded stays readable
    assert re.search(r"^rlproxy_trainer_rollouts_expired_total 1\.0$", metrics, re.MULTILINE), metrics
    assert late.status_code == 409 and "expired" in late.json()["error"]["message"]
    assert kept["status"] == "finished" and kept["reward"] == 1.0  # a rewarded rollout never expires


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_expiry_takes_the_oldest_open_rollouts_in_batches(store, sqlite_url, own_database_url):
    async def scenario() -> tuple[list[int], dict[str, str]]:
        database = open_database(sqlite_url if store == "sqlite" else own_database_url)  # both migrated
        sessions = session_factory(database)
        long_ago = utcnow() - timedelta(hours=7)
        async with sessions() as session, session.begin():
            for index in range(5):
                rollout = await create_rollout(session, f"old-{index}")
                rollout.created_at = long_ago + timedelta(seconds=index)
            await create_rollout(session, "recent")
            rewarded = await create_rollout(session, "old-rewarded")
            rewarded.created_at = long_ago
            await session.flush()
            await post_reward(session, "old-rewarded", 0.5)
        batches = []
        for _ in range(4):
            async with sessions() as session, session.begin():
                batches.append(await expire_open_rollouts(session, utcnow() - timedelta(hours=6), limit=2))
        async with sessions() as session:
            statuses = {r.id: r.status for r in (await session.execute(Rollout.__table__.select())).all()}
        await database.dispose()
        return batches, statuses

    batches, statuses = asyncio.run(scenario())
    assert batches == [2, 2, 1, 0]
    assert statuses == {**{f"old-{i}": "expired" for i in range(5)}, "recent": "open", "old-rewarded": "finished"}


def _wait_for_status(proxy: str, rollout_id: str, status: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = requests.get(f"{proxy}/rollouts/{rollout_id}").json()
        if body["status"] == status:
            return body
        time.sleep(0.5)
    raise AssertionError(f"rollout {rollout_id} still {body['status']!r} after {timeout} s")
