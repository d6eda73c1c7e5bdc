"""Evaluation gates (docs/gates.md) against real Postgres, the stub engine and real proxy processes: the traffic
canary's routing (fraction, stickiness, agreement between proxies, what the rollouts record), its judge
(promote a better candidate, retire a worse one, from rewards posted to the proxy), and the held-out
evaluation `rlproxy eval` and the trainer's held-out gate store on the policy."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from datetime import datetime, timedelta, timezone

import aiohttp
import openai
import pytest
import requests
from sqlalchemy import select

from core.promotion import promotes
from core.settings import TrainerSettings
from demo.evaluate import task_set
from demo.tasks import heldout_tasks
from proxy.policy import PolicyRouter, Route
from store import canary as canaries
from store import policies
from store import rollouts as store_rollouts
from store.calls import write_calls
from store.db import open_database, session_factory
from store.errors import Conflict
from store.evaluation import wilson
from store.models import Call, Rollout, utcnow
from store.records import CallRecord, ChoiceRecord
from tests.support import ROOT, add_policies, policy_evaluation, policy_row, running_proxy, transaction
from trainer.gates import CanaryGate, CommandGate, build_gate

BASE = "stub-model"
HELLO = [{"role": "user", "content": "hello"}]


# --- routing -------------------------------------------------------------------------------------------


async def test_the_router_sends_the_canary_its_fraction_of_new_rollouts_and_a_rollout_always_one_version(
        own_database_url, tmp_path):
    names = await add_policies(own_database_url, tmp_path, [1, 2], active=1)
    async with transaction(own_database_url) as session:
        started = await canaries.start(session, 2, 0.1)
    assert (started.version, started.fraction, started.parent) == (2, 0.1, 1)
    assert (await policy_row(own_database_url, 2)).status == "canary"

    database = open_database(own_database_url)
    try:
        router, other = PolicyRouter(session_factory(database), BASE), PolicyRouter(session_factory(database), BASE)
        await router.refresh()
        await other.refresh()
        ids = [uuid.UUID(int=i * 2654435761).hex for i in range(400)]
        routes = [router.route(BASE, rollout_id) for rollout_id in ids]
        on_canary = sum(r.policy_version == 2 for r in routes)
        assert 40 - 18 <= on_canary <= 40 + 18  # expected 40, sd 6
        assert {r for r in routes} == {Route(names[1], 1, "default"), Route(names[2], 2, "default")}
        # no per-rollout state: the same answer on every call, and from any router reading the same database
        assert [router.route(BASE, rollout_id) for rollout_id in ids] == routes
        assert [other.route(BASE, rollout_id) for rollout_id in ids] == routes
        assert all(router.version_for(rid) == r.policy_version for rid, r in zip(ids, routes))
        # a call without a rollout, and a model outside the policy, never go to the canary
        assert router.route(BASE) == Route(names[1], 1, "default")
        assert router.route("some-other-model", ids[0]) == Route("some-other-model", None)

        async with transaction(own_database_url) as session:  # a second canary waits for the first
            with pytest.raises(Conflict, match="already in canary"):
                await canaries.start(session, 1, 0.1)
            again = await canaries.start(session, 2, 0.5)  # a restarted trainer resumes the running one
        assert again == started

        async with transaction(own_database_url) as session:
            await policies.set_status(session, 2, "retired")
        await router.refresh()
        assert router.canary is None
        assert {router.route(BASE, rollout_id).policy_version for rollout_id in ids} == {1}
    finally:
        await database.dispose()


def test_two_proxies_on_one_database_send_every_call_of_a_rollout_to_the_same_version(
        own_database_url, stub_url, tmp_path):
    names = asyncio.run(add_policies(own_database_url, tmp_path, [1, 2], active=1, engine_url=stub_url))

    async def start():
        async with transaction(own_database_url) as session:
            return await canaries.start(session, 2, 0.5)

    canary = asyncio.run(start())
    expected = {f"agree-{i}": 2 if canaries.serves(canary, f"agree-{i}") else 1 for i in range(24)}
    assert set(expected.values()) == {1, 2}
    with running_proxy([stub_url], own_database_url, tmp_path, "a") as a, \
            running_proxy([stub_url], own_database_url, tmp_path, "b") as b:
        for rollout_id, version in expected.items():
            for proxy in (a, b, a):  # three calls of one rollout, through both proxies
                client = openai.OpenAI(base_url=f"{proxy}/rollouts/{rollout_id}/v1", api_key="unused")
                raw = client.chat.completions.with_raw_response.create(model=BASE, messages=HELLO)
                assert raw.headers["X-Rlproxy-Policy"] == str(version), (rollout_id, proxy)
                assert raw.parse().model == BASE  # the agent still sees the name it asked for
        # POST /rollouts stamps the rollout with the version its calls will get, on either proxy
        created = {}
        for proxy in (a, b) * 10:
            body = requests.post(f"{proxy}/rollouts", json={"task_id": "t"}).json()
            client = openai.OpenAI(base_url=body["base_url"], api_key="unused")
            raw = client.chat.completions.with_raw_response.create(model=BASE, messages=HELLO)
            created[body["rollout_id"]] = int(raw.headers["X-Rlproxy-Policy"])
        recorded = requests.get(f"{a}/rollouts/agree-0").json()
        assert [c["policy"] for c in recorded["calls"]] == [expected["agree-0"]] * 3

    async def stored():
        async with transaction(own_database_url) as session:
            rollouts = dict((await session.execute(select(Rollout.id, Rollout.policy_version))).all())
            calls = (await session.execute(select(Call.rollout_id, Call.policy_version, Call.upstream_model))).all()
        return rollouts, calls

    rollouts, calls = asyncio.run(stored())
    for rollout_id, version in {**expected, **created}.items():
        assert rollouts[rollout_id] == version  # set when the rollout began (by its first call, or POST /rollouts)
    assert len(calls) == 3 * len(expected) + len(created)
    for rollout_id, version, upstream_model in calls:
        assert version == {**expected, **created}[rollout_id]
        assert upstream_model == names[version]  # the adapter name the version's row keeps


# --- the judge -----------------------------------------------------------------------------------------


async def episode(http: aiohttp.ClientSession, proxy: str, rollout_id: str, reward_by_version: dict[int, float]) -> int:
    """One rollout as an agent runs it: a call through the proxy, then its final reward."""
    client = openai.AsyncOpenAI(base_url=f"{proxy}/rollouts/{rollout_id}/v1", api_key="unused", max_retries=0)
    try:
        raw = await client.chat.completions.with_raw_response.create(model=BASE, messages=HELLO)
    finally:
        await client.close()
    version = int(raw.headers["X-Rlproxy-Policy"])
    async with http.post(f"{proxy}/reward", json={"rollout_id": rollout_id,
                                                  "reward": reward_by_version[version]}) as response:
        assert response.status == 200, await response.text()
    return version


async def run_canary(database_url: str, proxy: str, version: int, *, rewards: dict[int, float],
                     per_arm: int, tag: str) -> bool | None:
    """Run the trainer's canary gate for `version` while agents produce exactly `per_arm` finished rollouts
    on the canary and on the active policy; returns the gate's decision."""
    settings = TrainerSettings(database_url=database_url, metrics_port=None, poll_interval=0.1, gate="canary",
                               canary_fraction=0.5, canary_min_rollouts=per_arm, gate_margin=0.1)
    gate = build_gate(settings)
    assert isinstance(gate, CanaryGate)
    decision = asyncio.create_task(gate(version))
    canary = None
    while canary is None or canary.version != version:
        assert not decision.done(), decision
        await asyncio.sleep(0.05)
        async with transaction(database_url) as session:
            canary = await canaries.running(session)
    ids = [f"{tag}-{i}" for i in range(400)]
    mine = [r for r in ids if canaries.serves(canary, r)][:per_arm]
    theirs = [r for r in ids if not canaries.serves(canary, r)][:per_arm]
    async with aiohttp.ClientSession() as http:
        probe = mine[-1] + "-probe"  # unrewarded: never evidence
        while not canaries.serves(canary, probe):
            probe += "x"
        for _ in range(100):  # the proxy reads the canary on its next refresh (1 s)
            client = openai.OpenAI(base_url=f"{proxy}/rollouts/{probe}/v1", api_key="unused")
            raw = await asyncio.to_thread(client.chat.completions.with_raw_response.create, model=BASE,
                                          messages=HELLO)
            if raw.headers["X-Rlproxy-Policy"] == str(version):
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the proxy never routed to the canary")
        # a rollout whose calls span two versions is no evidence for either, however it is rewarded
        await record_rollout(database_url, f"{tag}-mixed", (canary.parent, version), rewards[version])
        served = await asyncio.gather(*(episode(http, proxy, r, rewards) for r in mine + theirs))
    assert served == [version] * per_arm + [canary.parent] * per_arm
    return await asyncio.wait_for(decision, 30)


async def record_rollout(database_url: str, rollout_id: str, versions: tuple[int, int], reward: float) -> None:
    """A finished rollout of two calls, written as the proxy's writer does, answered by `versions`."""
    async with transaction(database_url) as session:
        await write_calls(session, [
            CallRecord(id=uuid.uuid4().hex, route="chat", started_at=utcnow(), rollout_id=rollout_id,
                       policy_version=v, prompt_token_ids=[1, 2], choices=[ChoiceRecord(0, [3], [-0.5], "stop")])
            for v in versions])
    async with transaction(database_url) as session:
        await store_rollouts.post_reward(session, rollout_id, reward)


async def test_the_judge_promotes_a_better_canary_and_retires_a_worse_one(own_database_url, stub_url, tmp_path):
    await add_policies(own_database_url, tmp_path, [1, 2, 3], active=1, engine_url=stub_url)
    with running_proxy([stub_url], own_database_url, tmp_path) as proxy:
        async with aiohttp.ClientSession() as http:  # before the canary: the active policy's, and no evidence
            for i in range(6):
                assert await episode(http, proxy, f"before-{i}", {1: 0.0}) == 1

        promoted = await run_canary(own_database_url, proxy, 2, rewards={2: 1.0, 1: 0.0}, per_arm=8, tag="better")
        assert promoted is True
        v1, v2 = await policy_row(own_database_url, 1), await policy_row(own_database_url, 2)
        assert (v1.status, v2.status) == ("retired", "active")
        verdict = (await policy_evaluation(own_database_url, 2))["canary"]
        assert verdict["promoted"] is True and verdict["fraction"] == 0.5 and verdict["parent"] == 1
        # exactly the rollouts answered since the canary began, each by one version
        assert (verdict["rollouts"], verdict["mean_reward"]) == (8, 1.0)
        assert (verdict["active_version"], verdict["active_rollouts"], verdict["active_mean_reward"]) == (1, 8, 0.0)
        assert datetime.fromisoformat(verdict["ended_at"]) >= datetime.fromisoformat(verdict["started_at"])

        # worse by more than the margin (0.6 vs 0.8): retired, and the active policy keeps serving
        retired = await run_canary(own_database_url, proxy, 3, rewards={3: 0.6, 2: 0.8}, per_arm=6, tag="worse")
        assert retired is False
        v2, v3 = await policy_row(own_database_url, 2), await policy_row(own_database_url, 3)
        assert (v2.status, v3.status) == ("active", "retired")
        retired_record = (await policy_evaluation(own_database_url, 3))["canary"]
        assert retired_record["promoted"] is False
        assert retired_record["mean_reward"] == pytest.approx(0.6)
        assert retired_record["active_mean_reward"] == pytest.approx(0.8)
        await asyncio.sleep(1.5)  # the proxy's next policy refresh
        listed = requests.get(f"{proxy}/policies").json()
        assert listed["active"] == 2
        assert {p["version"]: p["status"] for p in listed["data"]} == {0: "retired", 1: "retired", 2: "active",
                                                                       3: "retired"}
        # the verdicts are typed rows; GET /policies shows them as the `evaluation` object it always has
        assert [p["evaluation"] for p in listed["data"] if p["version"] == 3] == [{"canary": retired_record}]
        client = openai.OpenAI(base_url=f"{proxy}/v1", api_key="unused")
        for i in range(8):
            raw = client.chat.completions.with_raw_response.create(
                model=BASE, messages=HELLO, extra_headers={"X-Rollout-Id": f"after-{i}"})
            assert raw.headers["X-Rlproxy-Policy"] == "2"


async def test_the_judge_waits_for_enough_rollouts_on_both_sides(own_database_url, tmp_path):
    from trainer.gates import judge

    await add_policies(own_database_url, tmp_path, [1], active=None)
    async with transaction(own_database_url) as session:
        canary = await canaries.start(session, 1, 0.2)
    assert canary.parent == 0  # the base model is the active policy
    for i in range(5):  # plenty on the base model, too few on the canary
        await record_rollout(own_database_url, f"base-{i}", (0, 0), 0.0)
    await record_rollout(own_database_url, "canary-0", (1, 1), 1.0)
    async with transaction(own_database_url) as session:
        assert await judge(session, min_rollouts=2, margin=0.0) is None
        arms = await canaries.evidence(session, canary, (1, 0))
    assert (arms[1].rollouts, arms[0].rollouts) == (1, 5)
    await record_rollout(own_database_url, "canary-1", (1, 1), 1.0)
    async with transaction(own_database_url) as session:
        verdict = await judge(session, min_rollouts=2, margin=0.0)
    assert verdict is not None and verdict.promoted  # 1.0 vs 0.0
    assert (await policy_row(own_database_url, 1)).status == "active"


# --- the held-out evaluation ---------------------------------------------------------------------------


def test_the_95_percent_interval_and_the_promotion_rule():
    z2 = 1.959963984540054 ** 2
    assert wilson(0, 8) == pytest.approx((0.0, z2 / (8 + z2)))
    low, high = wilson(8, 8)
    assert (low, high) == pytest.approx((8 / (8 + z2), 1.0))
    assert wilson(20, 64) == pytest.approx((0.2123, 0.4339), abs=1e-4)  # docs/demo-tasks.md: 31.2%, 21–43%
    low, high = wilson(24, 48)
    assert low < 0.5 < high and 0.5 - low == pytest.approx(high - 0.5)
    assert promotes(0.30, 0.35, margin=0.1) and promotes(0.25, 0.35, margin=0.1)
    assert not promotes(0.24, 0.35, margin=0.1)


def rlproxy_eval(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlproxy.cli", "eval", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_rlproxy_eval_measures_a_policy_on_held_out_tasks_and_stores_it(own_database_url, stub_url, tmp_path):
    names = asyncio.run(add_policies(own_database_url, tmp_path, [1, 2]))
    began = datetime.now(timezone.utc)
    done = rlproxy_eval("--policy", "v1", "--upstream", stub_url, "--tasks", "8", "--database-url",
                        own_database_url)
    assert done.returncode == 0, done.stderr[-3000:]
    # the stub answers fixed words, never an ANSWER line: success 0 of 8, and the interval is Wilson's
    assert "held-out success 0.0% (0/8), 95% CI 0.0%–32.4% on 8 tasks" in done.stdout
    assert "stored on policy v1" in done.stderr
    evaluation = asyncio.run(policy_evaluation(own_database_url, 1))
    assert evaluation["heldout_success"] == 0.0 and evaluation["heldout_tasks"] == 8
    assert evaluation["heldout_ci95"] == pytest.approx([0.0, wilson(0, 8)[1]])
    assert evaluation["heldout_errors"] == 0
    assert evaluation["heldout_task_set"] == task_set(heldout_tasks(8))
    assert began - timedelta(seconds=5) <= datetime.fromisoformat(evaluation["when"]) <= datetime.now(timezone.utc)
    served = {m["id"] for m in requests.get(f"{stub_url}/v1/models").json()["data"]}
    assert names[1] in served  # --upstream loaded the adapter, under the name v1's row keeps

    with running_proxy([stub_url], own_database_url, tmp_path) as proxy:
        done = rlproxy_eval("--policy", "1", "--proxy", proxy, "--tasks", "4", "--database-url", own_database_url)
        assert done.returncode == 0, done.stderr[-3000:]
        assert asyncio.run(policy_evaluation(own_database_url, 1))["heldout_tasks"] == 4
        base = rlproxy_eval("--policy", "v0", "--proxy", proxy, "--tasks", "2", "--database-url", own_database_url)
        assert base.returncode == 0 and "(stub-model)" in base.stdout and "not stored" in base.stderr
        requests.post(f"{stub_url}/v1/unload_lora_adapter", json={"lora_name": names[2]})
        unloaded = rlproxy_eval("--policy", "v2", "--proxy", proxy, "--tasks", "2", "--database-url",
                                own_database_url)
        assert unloaded.returncode == 1 and "--upstream" in unloaded.stderr
    missing = rlproxy_eval("--policy", "v9", "--upstream", stub_url, "--database-url", own_database_url)
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    assert asyncio.run(policy_evaluation(own_database_url, 2)) is None


async def test_the_demo_gate_is_the_command_gate_scoring_the_gate_split_never_the_held_out_tasks(
        own_database_url, stub_url, tmp_path):
    from demo.score import command
    from store.verdicts import parent_score
    from trainer.gates.command import KEY, digest

    names = await add_policies(own_database_url, tmp_path, [1], engine_url=stub_url)
    # built in code, as `rlproxy train --gate heldout --heldout-tasks 4` builds it from its flags
    settings = TrainerSettings(database_url=own_database_url, upstreams=(stub_url,), metrics_port=None,
                               gate="heldout", heldout_tasks=4, gate_margin=0.1)
    template = command(tasks=4)
    assert (settings.gate, settings.eval_command) == ("command", template)
    gate = build_gate(settings)
    assert isinstance(gate, CommandGate)
    assert await gate(1) is True  # 0% vs the base model's 0%: not worse by more than the margin
    verdict = (await policy_evaluation(own_database_url, 1))[KEY]
    assert (verdict["score"], verdict["n"], verdict["set"], verdict["split"]) == (0.0, 4, "gate", "gate")
    assert (verdict["parent"], verdict["parent_score"], verdict["margin"], verdict["promoted"]) == (0, 0.0, 0.1, True)
    assert verdict["model"] == names[1] and verdict["verdict"] == "ok"
    async with transaction(own_database_url) as session:  # the base model's score is reused next time
        assert await parent_score(session, 0, digest(template, "gate")) == 0.0
        assert await parent_score(session, 0, digest(template, "heldout")) is None
        assert await parent_score(session, 1, digest(template, "gate")) == 0.0
    assert build_gate(TrainerSettings(metrics_port=None)) is None
    assert json.dumps(verdict)  # plain JSON all the way down


def test_the_gate_split_held_out_split_and_training_split_never_share_a_problem():
    from demo.tasks import gate_tasks, pool_size, train_tasks

    gate = {t.task_id for t in gate_tasks(pool_size("gate"))}
    heldout = {t.task_id for t in heldout_tasks(pool_size("heldout"))}
    train = {t.task_id for t in train_tasks(pool_size("train"))}
    assert len(gate) > 100 and len(heldout) > 100 and len(train) > 1000
    assert not (gate & heldout) and not (gate & train) and not (heldout & train)
