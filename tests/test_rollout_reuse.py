"""A rollout id retention pruned may be opened again, by another project, through another proxy of the same
database. The first proxy's memory of the old owner lasts `--key-cache-ttl` seconds at most, and within them the
writer still stores no call of one project in another project's rollout: it is set aside with the reason and
counted. Ids of other projects answer as unused ones on the routes that record nothing."""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import timedelta

import requests
from sqlalchemy import update

from store.db import open_database, session_factory
from store.models import Rollout, RolloutStatus, utcnow
from store.retention import prune
from testkit.stub_engine import BASE_MODEL
from tests.support import make_key, running_proxy

CHAT = {"model": BASE_MODEL, "messages": [{"role": "user", "content": "What is 6*7?"}]}
OPERATOR = "operator-key-of-the-reuse-test"
CACHE_TTL = 4.0


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def expire_and_prune(database_url: str, rollout_id: str) -> None:
    """What an operator's `rlproxy prune` does to an expired rollout, a day later."""
    async def go() -> None:
        database = open_database(database_url)
        try:
            sessions = session_factory(database)
            async with sessions() as session, session.begin():
                await session.execute(update(Rollout).where(Rollout.id == rollout_id).values(
                    status=RolloutStatus.EXPIRED, created_at=utcnow() - timedelta(days=2)))
            assert (await prune(sessions, utcnow() - timedelta(days=1))).rollouts == 1
        finally:
            await database.dispose()

    asyncio.run(go())


def calls_of(url: str, key: str, rollout_id: str) -> list[dict]:
    answer = requests.get(f"{url}/rollouts/{rollout_id}", headers=bearer(key), timeout=10)
    return answer.json()["calls"] if answer.status_code == 200 else []


def wait_for_calls(url: str, key: str, rollout_id: str, count: int) -> list[dict]:
    deadline = time.monotonic() + 10
    while len(calls := calls_of(url, key, rollout_id)) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    return calls


def test_a_pruned_id_opened_again_by_another_project_takes_no_call_of_the_first(stub_url, own_database_url, tmp_path):
    alpha, beta = make_key(own_database_url, "alpha"), make_key(own_database_url, "beta")
    rid = f"reused-{uuid.uuid4().hex[:8]}"
    chat = f"/rollouts/{rid}/v1/chat/completions"
    with running_proxy([stub_url], own_database_url, tmp_path, "first",
                       "--key-cache-ttl", str(CACHE_TTL), env={"RLPROXY_ADMIN_KEY": OPERATOR}) as first, \
            running_proxy([stub_url], own_database_url, tmp_path, "second") as second:
        assert requests.post(first + chat, json=CHAT, headers=bearer(alpha), timeout=10).status_code == 200
        assert len(wait_for_calls(first, alpha, rid, 1)) == 1
        expire_and_prune(own_database_url, rid)
        began = time.monotonic()
        assert requests.post(second + chat, json=CHAT, headers=bearer(beta), timeout=10).status_code == 200

        # The first proxy still remembers alpha as the owner: alpha's call is answered, but not stored in beta's.
        late = requests.post(first + chat, json=CHAT, headers=bearer(alpha), timeout=10)
        assert time.monotonic() - began < CACHE_TTL  # the test's premise: within the first proxy's memory
        assert late.status_code == 200
        late_id = late.headers["X-Rlproxy-Call-Id"]
        deadline = time.monotonic() + 10
        rejected = tmp_path / "first-spool.rejected.jsonl"
        while not rejected.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        kept = [json.loads(line) for line in rejected.read_text().splitlines()]
        assert [line["call"]["id"] for line in kept] == [late_id]
        assert "belongs to another project" in kept[0]["reason"]
        metrics = requests.get(f"{first}/metrics", headers=bearer(OPERATOR), timeout=10).text
        assert "rlproxy_capture_foreign_calls_total 1.0" in metrics
        assert [c["call_id"] for c in calls_of(second, beta, rid)] != [] and \
            late_id not in [c["call_id"] for c in calls_of(second, beta, rid)]

        # Past the cache's time the first proxy knows the new owner: beta is served there, alpha answered 404.
        time.sleep(max(0.0, CACHE_TTL + 0.5 - (time.monotonic() - began)))
        assert requests.post(first + chat, json=CHAT, headers=bearer(beta), timeout=10).status_code == 200
        assert requests.post(first + chat, json=CHAT, headers=bearer(alpha), timeout=10).status_code == 404
        assert len(wait_for_calls(second, beta, rid, 2)) == 2


def test_another_projects_id_answers_as_an_unused_one_where_nothing_is_recorded(stub_url, own_database_url,
                                                                                 tmp_path):
    alpha, beta = make_key(own_database_url, "alpha"), make_key(own_database_url, "beta")
    taken, unused = f"taken-{uuid.uuid4().hex[:8]}", f"unused-{uuid.uuid4().hex[:8]}"
    with running_proxy([stub_url], own_database_url, tmp_path, "proxy") as url:
        assert requests.post(f"{url}/rollouts/{taken}/v1/chat/completions", json=CHAT, headers=bearer(alpha),
                             timeout=10).status_code == 200
        count = {"model": BASE_MODEL, "messages": CHAT["messages"]}
        for rid in (taken, unused):
            models = requests.get(f"{url}/rollouts/{rid}/v1/models", headers=bearer(beta), timeout=10)
            health = requests.get(f"{url}/rollouts/{rid}/health", headers=bearer(beta), timeout=10)
            counted = requests.post(f"{url}/rollouts/{rid}/v1/messages/count_tokens", json=count,
                                    headers=bearer(beta), timeout=10)
            assert (models.status_code, health.status_code, counted.status_code) == (200, 200, 200), rid
        assert len(calls_of(url, alpha, taken)) == 1  # nothing of beta's was recorded
        assert requests.get(f"{url}/rollouts/{unused}", headers=bearer(beta), timeout=10).status_code == 404
