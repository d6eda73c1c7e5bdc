"""Policy verdicts as typed rows (store/verdicts.py) and migration 0009, which carried them out of the policy
row's `evaluation` JSON and back, on both databases the store supports."""
from __future__ import annotations

import asyncio
import copy

import pytest
from alembic import command
import sqlalchemy as sa
from sqlalchemy import select

from migrations.apply import alembic_config, upgrade
from store import policies, verdicts
from store.policies import adapter_name
from store.db import short_session
from core.policy_rules import DEFAULT_POLICY
from store.models import Policy, PolicyVerdict, utcnow
from testkit.processes import create_database, drop_database

# What the writers before 0009 left in `evaluation`: v1 scored as a parent by the command gate, v2 judged by
# every gate and measured by `rlproxy eval` both ways, beside the fleet's record (which stays in the JSON).
PARENT_MEASURED = {"command_gate": {
    "version": 1, "model": "rlproxy-v1", "split": "gate", "score": 0.4, "n": 8, "verdict": "ok", "detail": "",
    "seconds": 2.5, "returncode": 0, "digest": "gate-digest", "set": "gate", "when": "2026-01-01T12:00:00+00:00"}}
JUDGED = {
    "canary": {"fraction": 0.5, "started_at": "2026-01-01T00:00:00+00:00", "parent": 1, "traffic": "eval",
               "eval_agents": ["grader"], "rollouts": 8, "mean_reward": 1.0, "active_version": 1,
               "active_rollouts": 8, "active_mean_reward": 0.25, "margin": 0.05, "promoted": True,
               "ended_at": "2026-01-01T01:00:00+00:00"},
    "command_gate": {"version": 2, "model": "rlproxy-v2", "split": "gate", "score": 0.5, "n": 8, "verdict": "ok",
                     "detail": "", "seconds": 1.5, "returncode": 0, "digest": "gate-digest", "set": "gate",
                     "when": "2026-01-02T00:00:00+00:00", "parent": 1, "parent_score": 0.4, "margin": 0.05,
                     "promoted": True, "reason": "0.5 vs parent v1 0.4, margin 0.05"},
    "command_eval": {"heldout": {"score": 0.3, "n": 48, "digest": "eval-digest", "seconds": 9.0,
                                 "when": "2026-01-03T00:00:00+00:00"}},
    "heldout_success": 0.25, "heldout_tasks": 8, "heldout_ci95": [0.07, 0.59], "heldout_errors": 0,
    "heldout_task_set": "task-digest", "heldout_seconds": 3.0, "when": "2026-01-04T00:00:00+00:00",
    "fleet": {"digest": "adapter-digest", "reference": "the probe's answer"},
}
LEGACY = {1: PARENT_MEASURED, 2: JUDGED, 3: None}


@pytest.fixture(params=["postgres", "sqlite"])
def unmigrated_url(request, tmp_path):
    """A database with no schema yet, on each backend."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'rlproxy.db'}"
        return
    server = request.getfixturevalue("postgres_server")
    url = create_database(server, "rlproxy_test", migrate=False)
    yield url
    drop_database(server, url)


async def plant_legacy_policies(url: str) -> None:
    # the policies table as 0008 left it: the model's has columns of later migrations
    table = sa.table("policies", *map(sa.column, ("version", "name", "policy", "parent_version", "status", "path",
                                                  "base_model")),
                     sa.column("evaluation", Policy.evaluation.type), sa.column("created_at", Policy.created_at.type))
    async with short_session(url) as sessions, sessions() as session, session.begin():
        for version, evaluation in LEGACY.items():
            await session.execute(table.insert().values(
                version=version, name=adapter_name(version), policy=DEFAULT_POLICY, parent_version=version - 1,
                status="candidate", path=f"/adapters/v{version}", base_model="base",
                evaluation=copy.deepcopy(evaluation),
                created_at=utcnow()))  # as the writers before 0009 did


async def read(url: str, what):
    async with short_session(url) as sessions, sessions() as session:
        return await what(session)


def test_the_migration_moves_verdicts_into_typed_rows_and_the_downgrade_puts_them_back(unmigrated_url):
    upgrade(unmigrated_url, "0008")
    asyncio.run(plant_legacy_policies(unmigrated_url))

    upgrade(unmigrated_url)
    shown = asyncio.run(read(unmigrated_url, lambda s: policies.list_policies(s)))
    assert {p["version"]: p["evaluation"] for p in shown} == {0: None, **LEGACY}  # GET /policies: unchanged
    rows = asyncio.run(read(unmigrated_url, lambda s: _rows(s)))
    assert [(r.version, r.kind, r.split, r.score, r.parent_version, r.parent_score, r.promoted) for r in rows] == [
        (1, "command_gate", "gate", 0.4, None, None, None),
        (2, "canary", None, 1.0, 1, 0.25, True),
        (2, "command_gate", "gate", 0.5, 1, 0.4, True),
        (2, "command_eval", "heldout", 0.3, None, None, None),
        (2, "heldout", None, 0.25, None, None, None)]
    kept = asyncio.run(read(unmigrated_url, lambda s: _kept_json(s)))
    assert kept == {1: None, 2: {"fleet": JUDGED["fleet"]}, 3: None}  # only what is not a verdict stays

    command.downgrade(alembic_config(unmigrated_url), "0008")
    assert asyncio.run(read(unmigrated_url, lambda s: _kept_json(s))) == LEGACY


async def _rows(session):
    in_order = select(PolicyVerdict).order_by(PolicyVerdict.version, PolicyVerdict.id)
    return (await session.execute(in_order)).scalars().all()


async def _kept_json(session):
    return dict((await session.execute(select(Policy.version, Policy.evaluation).order_by(Policy.version))).all())


async def test_the_parents_score_is_its_newest_on_the_same_measure_its_own_or_kept_on_a_child(sqlite_url, tmp_path):
    async with short_session(sqlite_url) as sessions, sessions() as session, session.begin():
        for version in (1, 2):
            await policies.add_candidate(session, version, str(tmp_path), parent_version=version - 1, base_model="b")
        # v1's gate compared it with the base model (which has no row: the score is kept on the child only)
        await verdicts.add(session, 1, verdicts.COMMAND_GATE, split="gate", measured="m", score=0.5,
                           parent_version=0, parent_score=0.2, promoted=True)
        assert await verdicts.parent_score(session, 0, "m") == 0.2
        assert await verdicts.parent_score(session, 0, "another command") is None
        assert await verdicts.parent_score(session, 1, "m") == 0.5  # its own score as a candidate
        await verdicts.add(session, 2, verdicts.COMMAND_GATE, split="gate", measured="m", score=0.7,
                           parent_version=1, parent_score=0.45, promoted=True)
        assert await verdicts.parent_score(session, 1, "m") == 0.45  # measured again since: the newest counts
        assert await verdicts.parent_score(session, 2, "m") == 0.7
        with pytest.raises(ValueError, match="kind"):
            await verdicts.add(session, 2, "a hunch")
