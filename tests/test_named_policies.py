"""Named policies without the real engine: routing rules, the proxy routing by agent and project (a real
`rlproxy serve` in front of the stub engine), activation and rollback per policy, and one trainer training two
policies in turn from one batch of two-role episodes (tiny model, real Postgres)."""
from __future__ import annotations

import asyncio
import random
import subprocess
import uuid

import pytest
import requests
from sqlalchemy import select

from core.policy_rules import PolicyRules, RuleError
from core.settings import TrainerSettings, TrainingSettings
from store import rollouts as store_rollouts
from store.calls import write_calls
from store.db import open_database, session_factory
from store.models import Policy, Rollout, TrainStep, utcnow
from store.records import CallRecord, ChoiceRecord
from testkit.processes import rlproxy_command
from tests.conftest import TINY_VOCAB as VOCAB
from tests.support import add_policies, running_proxy
from trainer.batch import STALE, build_transitions
from trainer.transitions import SkipReasons

HELLO = [{"role": "user", "content": "hello"}]


# --- rules -----------------------------------------------------------------------------------------------------

def test_rules_pick_the_first_match_and_unmatched_calls_get_the_default():
    rules = PolicyRules.parse(["project:duo&agent:checker=duo-checker", "agent:solver=solver",
                               "project:acme=acme"], default="base")
    assert rules.choose("checker", "duo") == "duo-checker"
    assert rules.choose("checker", "solo") == "base"
    assert rules.choose("solver", "acme") == "solver"  # the earlier rule wins
    assert rules.choose(None, "acme") == "acme"
    assert rules.choose(None, None) == "base"
    assert rules.needs_agent
    assert rules.policies() == ["duo-checker", "solver", "acme"]  # base has no adapter


@pytest.mark.parametrize("rule", ["solver", "agent:solver", "agent=solver", "role:solver=x", "agent:=x",
                                  "agent:solver=bad name", "agent:a&=x"])
def test_a_rule_that_cannot_be_used_says_why(rule):
    with pytest.raises(RuleError, match="policy"):
        PolicyRules.parse([rule])


def test_serve_refuses_a_bad_rule_before_it_starts():
    done = subprocess.run(rlproxy_command("serve", "--upstream", "http://127.0.0.1:9", "--policy-rule", "agent:solver"),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--policy-rule" in done.stderr and "CONDITIONS=POLICY" in done.stderr


def test_the_trainer_refuses_to_train_the_base_model():
    with pytest.raises(ValueError, match="never trained"):
        TrainerSettings(policies=("solver", "base"))


# --- the proxy ---------------------------------------------------------------------------------------------------

def test_each_agent_is_answered_by_its_own_policy_and_rolls_back_alone(own_database_url, stub_url, tmp_path):
    asyncio.run(add_policies(own_database_url, tmp_path, [1], active=1, engine_url=stub_url))  # default's v1
    asyncio.run(add_policies(own_database_url, tmp_path, [2], active=2, engine_url=stub_url, policy="solver"))
    rules = ["--policy-rule", "agent:solver=solver", "--policy-rule", "agent:checker=base"]
    with running_proxy([stub_url], own_database_url, tmp_path, "proxy-named", *rules,
                       "--policy-refresh-interval", "0.2") as proxy:
        def ask(agent: str) -> tuple[str, str, str]:
            answer = requests.post(f"{proxy}/rollouts/r-{agent}/agents/{agent}/v1/chat/completions",
                                   json={"model": "stub-model", "messages": HELLO})
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == "stub-model"  # the agent sees the name it asked for
            return (answer.headers["X-Rlproxy-Policy-Name"], answer.headers["X-Rlproxy-Policy"],
                    answer.json()["choices"][0]["message"]["content"])

        assert ask("solver")[:2] == ("solver", "2")
        assert ask("checker")[:2] == ("base", "0")
        assert ask("writer")[:2] == ("default", "1")  # no rule: the default policy

        listed = requests.get(f"{proxy}/policies", params={"policy": "solver"}).json()
        assert (listed["policy"], listed["active"]) == ("solver", 2)
        assert [(p["version"], p["policy"], p["status"]) for p in listed["data"]] == [
            (0, "solver", "retired"), (2, "solver", "active")]
        assert listed["policies"] == {"solver": 2, "default": 1}

        wrong = requests.post(f"{proxy}/policies/2/activate", params={"policy": "default"})
        assert wrong.status_code == 400 and "belongs to policy 'solver'" in wrong.json()["error"]["message"]
        back = requests.post(f"{proxy}/policies/0/activate", params={"policy": "solver"})
        assert back.json() == {"version": 0, "policy": "solver", "status": "active"}
        assert ask("solver")[:2] == ("solver", "0")
        assert ask("writer")[:2] == ("default", "1")  # the other policy is untouched

        recorded = requests.get(f"{proxy}/rollouts/r-solver").json()
        assert [c["policy_name"] for c in recorded["calls"]] == ["solver", "solver"]


# --- the trainer -------------------------------------------------------------------------------------------------

async def record_two_role_episodes(database_url: str, groups: int, group_size: int) -> list[str]:
    """Episodes of a solver call then a checker call, each answered by its own policy, one reward each."""
    rng = random.Random(1)
    database = open_database(database_url)
    sessions = session_factory(database)
    ids = []
    for g in range(groups):
        for member in range(group_size):
            rollout_id = uuid.uuid4().hex
            records = []
            for agent in ("solver", "checker"):
                completion = [rng.randrange(3, VOCAB) for _ in range(4)] + [2]
                records.append(CallRecord(
                    id=uuid.uuid4().hex, route="chat", started_at=utcnow(), rollout_id=rollout_id, agent=agent,
                    task_id=f"task-{g}", policy_version=0, policy=agent,
                    prompt_token_ids=[rng.randrange(3, VOCAB) for _ in range(10)],
                    choices=[ChoiceRecord(0, completion, [-1.0] * len(completion), "stop")]))
            async with sessions() as session, session.begin():
                await write_calls(session, records)
            async with sessions() as session, session.begin():
                await store_rollouts.post_reward(session, rollout_id, float(member % 2), task_id=f"task-{g}")
            ids.append(rollout_id)
    await database.dispose()
    return ids


def test_one_trainer_trains_each_policy_from_its_own_calls_of_the_same_episodes(
        tiny_model, own_database_url, stub_url, tmp_path):
    pytest.importorskip("torch")
    from trainer.worker import TrainerWorker

    rollout_ids = asyncio.run(record_two_role_episodes(own_database_url, groups=2, group_size=4))
    settings = TrainerSettings(database_url=own_database_url, upstreams=(stub_url,), adapters_dir=tmp_path,
                               metrics_port=None, worker_id="two-policies", policies=("solver", "checker"),
                               training=TrainingSettings(batch_rollouts=8, group_size=4, micro_batch_tokens=512,
                                                         learning_rate=1e-3))

    async def train():
        worker = TrainerWorker(settings, tiny_model)
        await worker.start()
        try:
            stepped = await worker.step_once()
        finally:
            await worker.database.dispose()
        async with session_factory(open_database(own_database_url))() as session:
            versions = (await session.execute(select(Policy).order_by(Policy.version))).scalars().all()
            steps = (await session.execute(select(TrainStep).order_by(TrainStep.id))).scalars().all()
            marked = (await session.execute(select(Rollout.trained_at).where(Rollout.id.in_(rollout_ids)))).all()
        return stepped, worker, versions, steps, marked

    stepped, worker, versions, steps, marked = asyncio.run(train())
    assert stepped
    assert [(v.version, v.policy, v.status, v.parent_version) for v in versions] == [
        (1, "solver", "active", 0), (2, "checker", "active", 0)]
    # each policy trained on its own calls only: 8 episodes, one call each, the other role's skipped
    assert [(s.policy_version, s.transition_count, s.metrics["skipped"]) for s in steps] == [
        (1, 8, {"other_policy": 8}), (2, 8, {"other_policy": 8})]
    assert all(moment is not None for (moment,) in marked)  # claimed and marked once for both
    assert (worker.lines["solver"].parent_version, worker.lines["checker"].parent_version) == (1, 2)
    served = {m["id"] for m in requests.get(f"{stub_url}/v1/models").json()["data"]}
    assert {v.name for v in versions} <= served  # each version under the adapter name its row keeps


def test_staleness_counts_versions_of_the_calls_own_policy():
    from store.training import CallData, RolloutData

    call = CallData("c", 0, "solver", 3, [5, 6, 7], "first", [([8, 9, 2], [-1.0, -1.0, -1.0])], policy="solver")
    episodes = [RolloutData("r1", "t", 1.0, utcnow(), [call]),
                RolloutData("r2", "t", 0.0, utcnow(), [CallData(**{**_fields(call), "id": "d"})])]
    config = TrainingSettings(max_staleness=1)
    # solver's line is v3, v9: v9 is one solver version after v3 (v4..v8 were other policies'), so not stale
    lineage = {0: 0, 3: 1, 9: 2}
    skips = SkipReasons()
    assert len(build_transitions(episodes, config, 9, skips, policy="solver", lineage=lineage)) == 2
    skips = SkipReasons()
    assert build_transitions(episodes, config, 9, skips) == [] and skips[STALE] == 2  # counted globally: stale


def _fields(call) -> dict:
    return {name: getattr(call, name) for name in call.__slots__}
