"""Times one machine writes and another compares are the database's: a rollout's creation (by whichever proxy)
and the reward TTL's cutoff (by the trainer). A proxy whose clock was 7 h behind the trainer's had each new rollout
expired by a 1 h TTL at once; here the trainer's clock is 7 h ahead of the proxy's and the database's."""
from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import requests
from prometheus_client import CollectorRegistry
from sqlalchemy import select

from core.settings import TrainerSettings
from store.db import open_database, session_factory
from store.models import Rollout, RolloutStatus, utcnow
from store.rollouts import create_rollout
from testkit.stub_engine import BASE_MODEL
from tests.support import running_proxy
from trainer.housekeeping import Housekeeping
from trainer.metrics import TrainerMetrics

SKEW = timedelta(hours=7)


def expire_with_a_clock_ahead(database_url: str, monkeypatch) -> None:
    """The trainer's reward-TTL pass (1 h), run where the clock says 7 h later than the database's."""
    monkeypatch.setattr("trainer.housekeeping.utcnow", lambda: utcnow() + SKEW, raising=False)
    settings = TrainerSettings(database_url=database_url, reward_ttl_s=3600)

    async def go() -> None:
        database = open_database(database_url)
        try:
            await Housekeeping(settings, session_factory(database), TrainerMetrics(CollectorRegistry())) \
                .expire_unrewarded()
        finally:
            await database.dispose()

    asyncio.run(go())


async def statuses(database_url: str, ids: list[str]) -> dict[str, str]:
    database = open_database(database_url)
    try:
        async with session_factory(database)() as session:
            return dict((await session.execute(select(Rollout.id, Rollout.status).where(Rollout.id.in_(ids)))).all())
    finally:
        await database.dispose()


def test_a_trainer_whose_clock_is_ahead_expires_no_new_rollout(stub_url, own_database_url, tmp_path, monkeypatch):
    with running_proxy([stub_url], own_database_url, tmp_path, "clock") as url:
        created = requests.post(f"{url}/rollouts", json={"task_id": "t"}, timeout=10).json()["rollout_id"]
        implicit = uuid.uuid4().hex  # opened by its first call (the writer creates its row)
        chat = {"model": BASE_MODEL, "messages": [{"role": "user", "content": "hi"}]}
        assert requests.post(f"{url}/rollouts/{implicit}/v1/chat/completions", json=chat, timeout=10).ok
        assert requests.get(f"{url}/rollouts/{implicit}", timeout=10).ok  # stored by now

    # and a proxy whose clock is 7 h behind creates one in process
    behind = uuid.uuid4().hex
    monkeypatch.setattr("store.rollouts.utcnow", lambda: utcnow() - SKEW)

    async def create_behind() -> None:
        database = open_database(own_database_url)
        try:
            async with session_factory(database)() as session, session.begin():
                await create_rollout(session, behind, task_id="t")
        finally:
            await database.dispose()

    asyncio.run(create_behind())
    expire_with_a_clock_ahead(own_database_url, monkeypatch)
    assert asyncio.run(statuses(own_database_url, [created, implicit, behind])) == {
        created: RolloutStatus.OPEN, implicit: RolloutStatus.OPEN, behind: RolloutStatus.OPEN}
