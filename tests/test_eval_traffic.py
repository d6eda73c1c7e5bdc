"""Evaluation traffic, for any agent: rollouts marked `eval` at creation (`POST /rollouts {"eval": true}`), by
the `X-Rlproxy-Eval` header on their calls, or by agent name (`rlproxy train --eval-agents`) are served like any
other, never claimed by the trainer, and their final rewards are reported per policy version in `GET /policies`
(n, mean, 95% interval) and in Prometheus metrics. A real `rlproxy serve`, a stub engine process of its own,
real Postgres; the trainer's claim is the worker's own, and the store is checked on SQLite too."""
from __future__ import annotations

import asyncio
import math
import re
import statistics
import uuid
from pathlib import Path

import pytest
import requests

from store import evaluation, policies, training
from store import rollouts as store_rollouts
from store.calls import write_calls
from store.db import open_database, session_factory
from store.models import utcnow
from store.reward_sources import RewardedBy, RewardSource
from store.records import CallRecord, ChoiceRecord
from tests.support import free_port, running, running_proxy, stub_command

MESSAGES = [{"role": "user", "content": "What is 6 times 7?"}]
Z = 1.959963984540054


def wilson(successes: int, n: int) -> tuple[float, float]:
    p = successes / n
    centre = (p + Z * Z / (2 * n)) / (1 + Z * Z / n)
    half = Z * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n)) / (1 + Z * Z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def t_interval(values: list[float], t975: float) -> tuple[float, float]:
    mean, half = statistics.fmean(values), t975 * statistics.stdev(values) / math.sqrt(len(values))
    return mean - half, mean + half


class Agent:
    """An agent talking to the proxy over HTTP the way a real one does."""

    def __init__(self, proxy: str) -> None:
        self.proxy = proxy
        self.graders: dict[str, str] = {}  # rollout id -> the grader token of an evaluation rollout it created

    def create(self, **body) -> str:
        answer = requests.post(f"{self.proxy}/rollouts", json=body)
        assert answer.status_code == 201, answer.text
        if answer.json()["grader_token"]:
            self.graders[answer.json()["rollout_id"]] = answer.json()["grader_token"]
        return answer.json()["rollout_id"]

    def call(self, path: str, headers: dict[str, str] | None = None, expect_policy: str | None = None) -> None:
        answer = requests.post(f"{self.proxy}{path}/chat/completions", headers=headers or {},
                               json={"model": "stub-model", "messages": MESSAGES, "max_tokens": 4})
        assert answer.status_code == 200, answer.text
        if expect_policy is not None:
            assert answer.headers["X-Rlproxy-Policy"] == expect_policy

    def reward(self, rollout_id: str, value: float) -> None:
        """The final reward, as its grader (an evaluation rollout created with eval: true) or its agent."""
        grader = self.graders.get(rollout_id)
        answer = requests.post(f"{self.proxy}/reward", json={"rollout_id": rollout_id, "reward": value},
                               headers={"Authorization": f"Bearer {grader}"} if grader else {})
        assert answer.status_code == 200 and "claim" not in answer.json(), answer.text

    def rollout(self, rollout_id: str) -> dict:
        answer = requests.get(f"{self.proxy}/rollouts/{rollout_id}")
        assert answer.status_code == 200, answer.text
        return answer.json()

    def traffic(self) -> dict[int, dict]:
        listed = requests.get(f"{self.proxy}/policies").json()["data"]
        return {p["version"]: p["evaluation_traffic"] for p in listed}

    def episode(self, value: float, *, expect_policy: str = "0", **body) -> str:
        rollout_id = self.create(**body)
        self.call(f"/rollouts/{rollout_id}/v1", expect_policy=expect_policy)
        self.reward(rollout_id, value)
        return rollout_id


def metric(text: str, name: str, policy: str) -> float | None:
    found = re.search(rf'^{name}{{policy="{policy}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else None


def adapter_folder(path: Path) -> Path:
    path.mkdir()
    (path / "adapter_config.json").write_text("{}")
    (path / "adapter_model.safetensors").write_bytes(b"")
    return path


def test_eval_rollouts_are_served_never_claimed_and_reported_per_version(own_database_url, tmp_path):
    pytest.importorskip("torch")
    from core.settings import TrainerSettings, TrainingSettings
    from trainer.worker import TrainerWorker

    port = free_port()
    engine_url = f"http://127.0.0.1:{port}"
    with running(stub_command(port), engine_url + "/health", log_path=tmp_path / "stub.log"), \
            running_proxy([engine_url], own_database_url, tmp_path) as proxy:
        agent = Agent(proxy)
        # training traffic: created by POST /rollouts, or implicitly by a first call without the header
        normal = [agent.episode(1.0, task_id="t-a"), agent.episode(0.0, task_id="t-b")]
        implicit = uuid.uuid4().hex
        agent.call(f"/rollouts/{implicit}/v1")
        agent.reward(implicit, 0.5)
        normal.append(implicit)

        # evaluation traffic under the base model (v0): by body, by header on an implicit rollout's first call,
        # by header on a later call of a rollout created without it
        by_body = [agent.episode(value, task_id="e", eval=True) for value in (1.0, 0.0, 1.0)]
        by_header = uuid.uuid4().hex
        agent.call("/v1", headers={"X-Rollout-Id": by_header, "X-Rlproxy-Eval": "1"}, expect_policy="0")
        agent.reward(by_header, 1.0)
        late = agent.create(task_id="late")
        agent.call(f"/rollouts/{late}/v1")
        agent.call(f"/rollouts/{late}/v1", headers={"X-Rlproxy-Eval": "TRUE"})
        agent.call(f"/rollouts/{late}/v1", headers={"X-Rlproxy-Eval": "0"})  # once marked, it stays marked
        agent.reward(late, 0.0)
        still_open = agent.create(eval=True)  # no final reward yet: not counted
        agent.call(f"/rollouts/{still_open}/v1")
        # an evaluation agent's rollouts: the proxy does not know the name, the trainer will
        probes = [agent.episode(0.0, agent="probe", task_id="p")]
        implicit_probe = uuid.uuid4().hex
        agent.call(f"/rollouts/{implicit_probe}/agents/probe/v1")
        agent.reward(implicit_probe, 0.0)
        probes.append(implicit_probe)

        bad = requests.post(f"{proxy}/v1/chat/completions", headers={"X-Rlproxy-Eval": "maybe"},
                            json={"model": "stub-model", "messages": MESSAGES})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "X-Rlproxy-Eval"

        for rollout_id in normal + probes:
            assert agent.rollout(rollout_id)["eval"] is False
        for rollout_id in by_body + [by_header, late, still_open]:
            data = agent.rollout(rollout_id)
            assert data["eval"] is True and data["policy"] == 0 and data["calls"]  # served and recorded

        # the evidence: what an evaluation credential rewarded (the grader tokens of those created as evaluation);
        # those marked by the header are evaluation traffic too (never trained on), but their agent rewarded them
        v0_rewards = [1.0, 0.0, 1.0]
        traffic = agent.traffic()
        assert traffic[0]["n"] == len(v0_rewards) and traffic[0]["interval"] == "wilson"
        assert traffic[0]["mean"] == pytest.approx(statistics.fmean(v0_rewards))
        assert traffic[0]["ci95"] == pytest.approx(list(wilson(2, 3)))

        # a trained version serves; evaluation rollouts it serves are scored under it
        async def add_v1() -> None:
            db = open_database(own_database_url)
            async with session_factory(db)() as session, session.begin():
                await policies.add_candidate(session, 1, str(adapter_folder(tmp_path / "v1")), parent_version=0,
                                             base_model="stub-model")
            await db.dispose()

        asyncio.run(add_v1())
        assert requests.post(f"{proxy}/policies/1/activate").status_code == 200
        v1_rewards = [0.5, 0.25, 1.0, -0.5]
        v1_eval = [agent.episode(value, expect_policy="1", task_id="e1", eval=True) for value in v1_rewards]
        normal.append(agent.episode(1.0, expect_policy="1", task_id="t-c"))
        assert {agent.rollout(r)["policy"] for r in v1_eval} == {1}

        traffic = agent.traffic()
        assert traffic[1]["n"] == 4 and traffic[1]["interval"] == "t"
        assert traffic[1]["mean"] == pytest.approx(statistics.fmean(v1_rewards))
        assert traffic[1]["ci95"] == pytest.approx(list(t_interval(v1_rewards, 3.182446305)))  # t(0.975, 3)
        assert traffic[0]["n"] == 3  # unchanged: the base served those

        # the trainer: told the evaluation agent, it marks the probes and claims the training traffic only
        settings = TrainerSettings(database_url=own_database_url, upstreams=(engine_url,), adapters_dir=tmp_path,
                                   metrics_port=None, worker_id="eval-test",
                                   training=TrainingSettings(batch_rollouts=64, group_size=1, eval_agents=["probe"]))

        async def claim():
            worker = TrainerWorker(settings, tmp_path / "no-model")
            try:
                claimed = await worker._claim()
                again = await worker._claim()  # nothing left: the rest is evaluation traffic (or open)
                async with worker.sessions() as session:
                    waiting = await training.waiting_rollouts(session)
            finally:
                await worker.database.dispose()
            return claimed, again, waiting, worker.metrics

        claimed, again, waiting, trainer_metrics = asyncio.run(claim())
        assert sorted(claimed) == sorted(normal) and again == []
        assert waiting == len(normal)  # the leased ones still count as waiting to be trained
        exported = trainer_metrics.registry.get_sample_value
        assert exported("rlproxy_eval_reward_value_count", {"policy": "0"}) == 2  # the two probes
        assert exported("rlproxy_eval_reward_sum", {"policy": "0"}) == 0.0
        for rollout_id in probes:
            assert agent.rollout(rollout_id)["eval"] is True

        traffic = agent.traffic()  # the probes are evaluation traffic now, but their agent rewarded them: no evidence
        assert traffic[0]["n"] == 3 and traffic[0]["mean"] == pytest.approx(2 / 3)
        assert traffic[1]["n"] == 4

        # metrics: the proxy counts what was marked when the reward came (the trainer, the probes above)
        text = requests.get(f"{proxy}/metrics").text
        assert metric(text, "rlproxy_eval_reward_value_count", "0") == 3
        assert metric(text, "rlproxy_eval_reward_sum", "0") == pytest.approx(2.0)
        assert metric(text, "rlproxy_eval_reward_value_count", "1") == 4
        assert metric(text, "rlproxy_eval_reward_sum", "1") == pytest.approx(sum(v1_rewards))
        # every final reward is still in the overall histogram (probes and training traffic too)
        assert metric(text, "rlproxy_reward_value_count", "0") == 3 + 5 + 2
        assert metric(text, "rlproxy_reward_value_count", "1") == 5


@pytest.fixture(params=["postgres", "sqlite"])
async def sessions(request):
    url = request.getfixturevalue("own_database_url" if request.param == "postgres" else "sqlite_url")
    database = open_database(url)
    yield session_factory(database)
    await database.dispose()


async def _episode(sessions, reward: float, *, version: int | None = 0, eval: bool = False, agent: str | None = None,
                   project: str | None = None, header: bool = False, giver: str = RewardedBy.AGENT) -> str:
    """A rollout with one call and its final reward from `giver`; `eval`: created as evaluation (its grader gives
    its reward, as POST /rollouts makes it), `header`: marked by its call."""
    rollout_id = uuid.uuid4().hex
    async with sessions() as session, session.begin():
        await store_rollouts.create_rollout(session, rollout_id, task_id="t", agent=agent, project=project,
                                            policy_version=version, eval=eval,
                                            reward_source=RewardSource.GRADER if eval else RewardSource.AGENT)
    async with sessions() as session, session.begin():
        await write_calls(session, [CallRecord(
            id=uuid.uuid4().hex, route="chat", started_at=utcnow(), rollout_id=rollout_id, policy_version=version,
            prompt_token_ids=[1, 2, 3], choices=[ChoiceRecord(0, [4, 2], [-0.1, -0.2], "stop")], eval=header)])
    async with sessions() as session, session.begin():
        result = await store_rollouts.post_reward(session, rollout_id, reward, giver=giver)
    assert result.eval == (eval or header) and result.policy_version == version and not result.claim
    return rollout_id


async def test_the_store_skips_and_reports_evaluation_rollouts(sessions):
    """The claim, the marking by agent and the per-version report on both databases (booleans differ)."""
    normal = [await _episode(sessions, 1.0), await _episode(sessions, 0.0, agent="solver")]
    await _episode(sessions, 2.0, eval=True, giver=RewardedBy.GRADER)
    await _episode(sessions, 4.0, header=True, giver=RewardedBy.ADMIN)  # marked by its call, an admin rewarded it
    await _episode(sessions, 100.0, header=True)  # marked by its call, its agent rewarded it: no evidence
    await _episode(sessions, 9.0, eval=True, project="elsewhere", giver=RewardedBy.EVAL_KEY)
    await _episode(sessions, 1.0, eval=True, version=None, giver=RewardedBy.GRADER)  # no policy version: not reported
    probe = await _episode(sessions, 0.0, agent="probe", version=3)

    async with sessions() as session, session.begin():
        ready = await training.ready_rollouts(session, limit=16, group_size=1, group_timeout_s=0)
        assert set(ready) == set(normal) | {probe}
        assert await training.mark_eval_agents(session, ["probe", "nobody"]) == [(3, 0.0)]
        assert await training.mark_eval_agents(session, ["probe"]) == []  # marked once
        ready = await training.ready_rollouts(session, limit=16, group_size=1, group_timeout_s=0)
        assert sorted(ready) == sorted(normal)
        assert await training.waiting_rollouts(session) == 2
        assert sorted(await training.lease(session, ready + [probe], "me", 60)) == sorted(normal)

    async with sessions() as session:
        everyone = {p["version"]: p["evaluation_traffic"] for p in await policies.list_policies(session)}
        mine = await evaluation.traffic_by_version(session, project="mine")
    assert everyone[0]["n"] == 3 and everyone[0]["mean"] == pytest.approx(5.0)
    assert everyone[0]["ci95"] == pytest.approx(list(t_interval([2.0, 4.0, 9.0], 4.302652730)))
    assert mine[0]["n"] == 2 and mine[0]["mean"] == pytest.approx(3.0)  # another project's rollout left out
    # the probe marked by its agent's name is evaluation traffic now, but its agent rewarded it: no evidence
    assert set(everyone) == {0} and set(mine) == {0}


def test_intervals():
    assert evaluation.summarize(0, 0, 0, False) == {"n": 0, "mean": None, "ci95": None, "interval": None}
    assert evaluation.summarize(1, 0.7, 0.49, False) == {"n": 1, "mean": 0.7, "ci95": None, "interval": "t"}
    same = evaluation.summarize(3, 1.5, 0.75, False)  # no spread: a zero-width interval
    assert same["ci95"] == pytest.approx([0.5, 0.5])
    low, high = evaluation.summarize(8, 8, 8, True)["ci95"]
    assert high == 1.0 and 0.6 < low < 0.7
    # t quantiles: the table's last entry, then the series (exact values from R's qt(0.975, df))
    assert evaluation.t975(30) == pytest.approx(2.042272456, abs=1e-9)
    for df, exact in ((31, 2.039513446), (40, 2.021075390), (100, 1.983971519), (1000, 1.962339081)):
        assert evaluation.t975(df) == pytest.approx(exact, abs=1e-6)
