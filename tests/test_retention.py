"""Retention: `rlproxy prune` deletes what is done with past an age — trained, expired and finished evaluation
rollouts, and calls outside any rollout — and never open rollouts or training data the trainer has not
consumed; `--what bodies` and `--keep-trained-ids` keep the rows and clear only the bodies. On Postgres and
SQLite, the command run as a process."""
from __future__ import annotations

import asyncio
import subprocess
from datetime import timedelta

import pytest
from sqlalchemy import select

from store.db import open_database, session_factory
from store.models import Call, CallChoice, Reward, RewardKind, Rollout, RolloutStatus, utcnow
from testkit.processes import rlproxy_command

OLD = timedelta(days=40)
# rollout id -> (status, trained, eval, age)
ROLLOUTS = {
    "trained-old": (RolloutStatus.FINISHED, True, False, OLD),
    "expired-old": (RolloutStatus.EXPIRED, False, False, OLD),
    "eval-old": (RolloutStatus.FINISHED, False, True, OLD),
    "waiting-old": (RolloutStatus.FINISHED, False, False, OLD),  # rewarded, not trained yet: training data
    "open-old": (RolloutStatus.OPEN, False, False, OLD),
    "trained-new": (RolloutStatus.FINISHED, True, False, timedelta(0)),
}


async def fill(database_url: str) -> None:
    database = open_database(database_url)
    now = utcnow()
    async with session_factory(database)() as session, session.begin():
        for rollout_id, (status, trained, evaluation, age) in ROLLOUTS.items():
            session.add(Rollout(id=rollout_id, status=status, eval=evaluation, created_at=now - age,
                                trained_at=now if trained else None, reward=1.0 if status == "finished" else None))
        await session.flush()
        for rollout_id, (_, _, _, age) in [*ROLLOUTS.items(), (None, (None, None, None, OLD)),
                                            (None, (None, None, None, timedelta(0)))]:
            call_id = f"call-{rollout_id or ('loose-old' if age else 'loose-new')}"
            session.add(Call(id=call_id, rollout_id=rollout_id, route="chat", status="ok", started_at=now - age,
                             request={"messages": [{"role": "user", "content": "hi"}]},
                             response={"choices": [{"message": {"content": "hello"}}]}, prompt_token_ids=[1, 2]))
            await session.flush()
            session.add(CallChoice(call_id=call_id, index=0, token_ids=[3], logprobs=[-0.1]))
            if rollout_id:
                session.add(Reward(rollout_id=rollout_id, call_id=call_id, kind=RewardKind.AIR, value=-0.25))
    await database.dispose()


async def contents(database_url: str) -> tuple[set[str], dict[str, bool], int, int]:
    """(rollouts left, call id -> still has its bodies, choices left, rewards left)."""
    database = open_database(database_url)
    async with session_factory(database)() as session:
        rollouts = set((await session.execute(select(Rollout.id))).scalars())
        calls = {call_id: request is not None and response is not None for call_id, request, response in
                 (await session.execute(select(Call.id, Call.request, Call.response))).all()}
        choices = len((await session.execute(select(CallChoice.call_id))).all())
        rewards = len((await session.execute(select(Reward.id))).all())
    await database.dispose()
    return rollouts, calls, choices, rewards


def prune(database_url: str, *flags: str) -> str:
    done = subprocess.run(rlproxy_command("prune", "--database-url", database_url, "--older-than", "30d",
                                          "--batch", "2", *flags), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(params=["postgres", "sqlite"])
def filled(request, own_database_url, sqlite_url) -> str:
    url = own_database_url if request.param == "postgres" else sqlite_url
    asyncio.run(fill(url))
    return url


KEPT = {"waiting-old", "open-old", "trained-new"}


def test_pruning_deletes_what_is_done_with_and_keeps_training_data(filled):
    said = prune(filled)
    rollouts, calls, choices, rewards = asyncio.run(contents(filled))
    assert rollouts == KEPT
    assert set(calls) == {f"call-{r}" for r in KEPT} | {"call-loose-new"} and all(calls.values())
    assert choices == len(calls) and rewards == len(KEPT)  # nothing of what was deleted is left behind
    assert "3 rollouts and 4 calls deleted, 0 calls' bodies cleared" in said, said
    assert "0 rollouts and 0 calls deleted" in prune(filled)  # nothing left to do


def test_pruning_bodies_keeps_every_row_and_clears_only_the_bodies(filled):
    prune(filled, "--what", "bodies")
    rollouts, calls, choices, rewards = asyncio.run(contents(filled))
    assert rollouts == set(ROLLOUTS) and choices == len(calls) == len(ROLLOUTS) + 2
    cleared = {call_id for call_id, has_bodies in calls.items() if not has_bodies}
    assert cleared == {"call-trained-old", "call-expired-old", "call-eval-old", "call-loose-old"}


def test_keep_trained_ids_keeps_trained_rows_without_their_bodies(filled):
    prune(filled, "--keep-trained-ids")
    rollouts, calls, _, rewards = asyncio.run(contents(filled))
    assert rollouts == KEPT | {"trained-old"}
    assert calls["call-trained-old"] is False and rewards == len(KEPT) + 1
    assert all(has_bodies for call_id, has_bodies in calls.items() if call_id != "call-trained-old")


def test_a_bad_age_is_a_usage_error(sqlite_url):
    done = subprocess.run(rlproxy_command("prune", "--database-url", sqlite_url, "--older-than", "soon"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "expected a duration like 30d" in done.stderr


@pytest.mark.parametrize("age", ["0", "30"])
def test_an_age_without_a_unit_that_would_delete_nearly_everything_is_refused(sqlite_url, age):
    """`--older-than 30`, meant as days, is 30 seconds: every rollout done with would go."""
    done = subprocess.run(rlproxy_command("prune", "--database-url", sqlite_url, "--older-than", age),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "at least a minute, with its unit" in done.stderr


def test_the_trainer_prunes_the_same_way_between_steps(own_database_url):
    """`rlproxy train --prune-older-than 30d` runs the same pruning from the trainer's housekeeping."""
    from prometheus_client import CollectorRegistry

    from core.settings import Pruning, TrainerSettings
    from trainer.housekeeping import Housekeeping
    from trainer.metrics import TrainerMetrics

    asyncio.run(fill(own_database_url))
    settings = TrainerSettings(database_url=own_database_url, reward_ttl_s=0,
                               pruning=Pruning(older_than="30d", keep_trained_ids=True))
    metrics = TrainerMetrics(CollectorRegistry())

    async def housekeeping() -> None:
        database = open_database(own_database_url)
        try:
            chores = Housekeeping(settings, session_factory(database), metrics)
            await chores.run_due()
            await chores.run_due()  # not due again so soon: nothing more happens
        finally:
            await database.dispose()

    asyncio.run(housekeeping())
    rollouts, calls, _, _ = asyncio.run(contents(own_database_url))
    assert rollouts == KEPT | {"trained-old"} and calls["call-trained-old"] is False
    sample = metrics.registry.get_sample_value
    assert sample("rlproxy_trainer_pruned_rollouts_total") == 2 and sample("rlproxy_trainer_pruned_bodies_total") == 1


@pytest.mark.parametrize("store", ["postgres", "sqlite"])
def test_a_batch_is_bounded_by_the_calls_it_touches_not_only_by_rollouts(store, own_database_url, sqlite_url):
    """Rollouts of many calls each: one transaction takes as many as fit in `limit * 20` calls (one at least),
    so a batch never holds the write lock over millions of rows."""
    from store.retention import prune_batch

    url = own_database_url if store == "postgres" else sqlite_url

    async def scenario() -> list[int]:
        database = open_database(url)
        now = utcnow()
        sessions = session_factory(database)
        async with sessions() as session, session.begin():
            for n, calls in enumerate((30, 15, 50, 1)):
                session.add(Rollout(id=f"long-{n}", status=RolloutStatus.FINISHED, created_at=now - OLD + timedelta(
                    seconds=n), trained_at=now, reward=1.0, call_count=calls))
        dropped = []
        for _ in range(4):
            async with sessions() as session, session.begin():
                dropped.append((await prune_batch(session, now - timedelta(days=30), limit=2)).rollouts)
        await database.dispose()
        return dropped

    # limit 2: 40 calls a batch. 30 + 15 > 40: one; 15 alone; 50 alone (the first of a batch always goes); then 1
    assert asyncio.run(scenario()) == [1, 1, 1, 1]
