"""A rollout takes one final reward, on both databases, however many arrive at once: the same one again is a
no-op (200), a different one 409, and the database holds one final row (migration 0006 makes it its rule)."""
from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from threading import Barrier

import pytest
import requests
import sqlalchemy as sa

from migrations.apply import upgrade
from store.models import Reward, utcnow
from testkit.processes import create_database, drop_database
from tests.support import running_proxy

AT_ONCE = 20


@pytest.fixture(scope="module", params=["postgres", "sqlite"])
def proxy(request, stub_url, run_dir, postgres_server):
    """The proxy as a real process on each database (a fresh one, migrated by the proxy at its start)."""
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{run_dir / 'final-reward.db'}"
    else:
        url = create_database(postgres_server, "rlproxy_final_reward", migrate=False)
    try:
        with running_proxy([stub_url], url, run_dir, f"proxy-final-{request.param}") as proxy_url:
            yield proxy_url
    finally:
        if request.param == "postgres":
            drop_database(postgres_server, url)


def post_at_once(proxy_url: str, rollout_id: str, values: list[float]) -> list[requests.Response]:
    """One `POST /reward` per value, each on a connection of its own opened beforehand, sent together."""
    start = Barrier(len(values))

    def post(value: float) -> requests.Response:
        with requests.Session() as client:
            client.get(f"{proxy_url}/healthz")
            start.wait()
            return client.post(f"{proxy_url}/reward", json={"rollout_id": rollout_id, "reward": value})

    with ThreadPoolExecutor(len(values)) as pool:
        return list(pool.map(post, values))


def final_rewards(proxy_url: str, rollout_id: str) -> tuple[float, list[float]]:
    rollout = requests.get(f"{proxy_url}/rollouts/{rollout_id}").json()
    return rollout["reward"], [r["value"] for r in rollout["rewards"] if r["kind"] == "final"]


def test_twenty_different_final_rewards_at_once_one_is_accepted(proxy):
    rollout_id = requests.post(f"{proxy}/rollouts", json={}).json()["rollout_id"]
    answers = post_at_once(proxy, rollout_id, [i / 10 for i in range(AT_ONCE)])

    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200] + [409] * (AT_ONCE - 1), [a.text for a in answers]
    [accepted] = [a.json()["reward"] for a in answers if a.status_code == 200]
    assert all(a.json()["error"]["type"] for a in answers if a.status_code == 409)
    assert final_rewards(proxy, rollout_id) == (accepted, [accepted])


def test_twenty_identical_final_rewards_at_once_are_all_accepted_and_stored_once(proxy):
    rollout_id = requests.post(f"{proxy}/rollouts", json={}).json()["rollout_id"]
    answers = post_at_once(proxy, rollout_id, [0.75] * AT_ONCE)

    assert [a.status_code for a in answers] == [200] * AT_ONCE, [a.text for a in answers]
    assert final_rewards(proxy, rollout_id) == (0.75, [0.75])


# --- a database that already holds duplicates still migrates ---------------------------------------------


@pytest.fixture(params=["postgres", "sqlite"])
def database_before_0006(request, postgres_server, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'old.db'}"
        return
    url = create_database(postgres_server, "rlproxy_before_0006", migrate=False)
    try:
        yield url
    finally:
        drop_database(postgres_server, url)


def test_duplicate_final_rewards_are_reduced_to_the_rollouts_own_on_migration(database_before_0006):
    upgrade(database_before_0006, "0005")
    raced, judged = uuid.uuid4().hex, uuid.uuid4().hex
    engine = sa.create_engine(database_before_0006.replace("+aiosqlite", "").replace("+asyncpg", "+psycopg"))
    try:
        with engine.begin() as connection:
            # a race the old code lost: three final rows, the rollout holds the second one's value
            # the rollouts table as 0005 left it: the model's has columns of later migrations
            rollouts = sa.table("rollouts", *map(sa.column, ("id", "status", "reward", "eval", "call_count",
                                                             "created_at")))
            connection.execute(rollouts.insert(), [
                {"id": rollout_id, "status": "finished", "reward": reward, "eval": False, "call_count": 0,
                 "created_at": utcnow()} for rollout_id, reward in ((raced, 0.5), (judged, 0.6))])
            connection.execute(Reward.__table__.insert(), [
                {"rollout_id": raced, "kind": "final", "value": value, "reason": None}
                for value in (0.1, 0.5, 0.9)])
            # judge+posted: the posted reward and the judge's score, one final row each, both kept
            connection.execute(Reward.__table__.insert(), [
                {"rollout_id": judged, "kind": "final", "value": 1.0, "reason": None},
                {"rollout_id": judged, "kind": "final", "value": 0.2, "reason": "judge"}])

        upgrade(database_before_0006)

        finals = sa.select(Reward.rollout_id, Reward.value, Reward.reason).where(Reward.kind == "final")
        with engine.connect() as connection:
            assert sorted(connection.execute(finals), key=str) == sorted(
                [(raced, 0.5, None), (judged, 1.0, None), (judged, 0.2, "judge")], key=str)
            with pytest.raises(sa.exc.IntegrityError):  # and from now on the database refuses a second one
                connection.execute(Reward.__table__.insert(), {"rollout_id": raced, "kind": "final",
                                                               "value": 0.9})
    finally:
        engine.dispose()
