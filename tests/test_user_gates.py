"""A user's own agent — not the demo — gated and evaluated on its own evidence (docs/gates.md), with real
processes: the stub engine, real Postgres, real proxy processes, and the user's evaluation script run by the
trainer's command gate as a real subprocess.

    --gate command       the user's script scores the candidate and its parent; time limit, exit status and
                         output without a score each give a clear verdict, and the candidate is not promoted
    --gate eval-traffic  the candidate answers a share of new evaluation rollouts only; production traffic
                         never sees it; the rewards the agent posts decide
    rlproxy eval         the same command or the same traffic, saying which set each number is from
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import aiohttp
import openai
import pytest

from core.settings import TrainerSettings, TrainingSettings
from store import canary as canaries
from tests.support import PYTHON, ROOT, add_policies, policy_evaluation, policy_row, running_proxy
from trainer.gates import CanaryGate, CommandGate, build_gate
from trainer.gates.command import KEY, EvalCommandError

BASE = "stub-model"
SCRIPT = ROOT / "tests" / "scripts" / "scripted_eval.py"


def user_script(mode: str = "ok", only: str | None = None) -> str:
    return f"{PYTHON} {SCRIPT} --model {{model}} --split {{split}} --mode {mode}" + (f" --only {only}" if only else "")


def command_gate(database_url: str, engine: str, template: str, **settings) -> CommandGate:
    gate = build_gate(TrainerSettings(database_url=database_url, upstreams=(engine,), metrics_port=None,
                                      gate="command", eval_command=template, gate_margin=0.1, **settings))
    assert isinstance(gate, CommandGate)
    return gate


def runs(path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def test_the_command_gate_promotes_on_the_users_score_and_retires_a_worse_candidate(
        own_database_url, stub_url, tmp_path, monkeypatch):
    names = await add_policies(own_database_url, tmp_path, [1, 2], engine_url=stub_url)  # version -> adapter
    runs_file = tmp_path / "runs.txt"
    monkeypatch.setenv("RUNS_FILE", str(runs_file))
    monkeypatch.setenv("SCORES", json.dumps({BASE: 0.5, names[1]: 0.55, names[2]: 0.3}))
    gate = command_gate(own_database_url, stub_url, user_script())

    assert await gate(1) is True  # 0.55 vs the base model's 0.5
    verdict = (await policy_evaluation(own_database_url, 1))[KEY]
    assert (verdict["score"], verdict["n"], verdict["parent"], verdict["parent_score"]) == (0.55, 20, 0, 0.5)
    assert verdict["set"] == "gate" and verdict["promoted"] is True
    assert runs(runs_file) == [f"{BASE} gate", f"{names[1]} gate"]  # each asked on the URL the gate gave

    assert await gate(2) is False  # 0.3 vs its parent v1's 0.55: worse by more than the margin
    verdict = (await policy_evaluation(own_database_url, 2))[KEY]
    assert (verdict["score"], verdict["parent"], verdict["parent_score"], verdict["promoted"]) == (0.3, 1, 0.55, False)
    assert runs(runs_file)[2:] == [f"{names[2]} gate"]  # v1's score was kept: one run per candidate


@pytest.mark.parametrize("mode, verdict, detail", [
    ("exit", "exit", "exited with status 3: could not reach the grader"),
    ("garbage", "no-score", 'printed no JSON line like {"score"'),
    ("hang", "timeout", "timed out after 8 s (killed)"),
])
async def test_a_failing_evaluation_script_is_a_clear_verdict_never_a_promotion(
        own_database_url, stub_url, tmp_path, monkeypatch, mode, verdict, detail):
    names = await add_policies(own_database_url, tmp_path, [1], engine_url=stub_url)
    monkeypatch.setenv("RUNS_FILE", str(tmp_path / "runs.txt"))
    monkeypatch.setenv("SCORES", json.dumps({BASE: 0.5}))
    gate = command_gate(own_database_url, stub_url, user_script(mode, only=names[1]), eval_timeout=8)
    began = time.monotonic()
    assert await gate(1) is False
    assert time.monotonic() - began < 40  # a hung script is killed at its time limit
    kept = (await policy_evaluation(own_database_url, 1))[KEY]
    assert kept["verdict"] == verdict and kept["score"] is None and kept["promoted"] is False
    assert detail in kept["detail"] and detail in kept["reason"]


async def test_a_parent_the_gate_cannot_score_is_an_alert_that_says_what_the_gate_needs(
        own_database_url, stub_url, tmp_path, monkeypatch, caplog):
    """Without the parent's score every candidate would be retired: that is counted, logged as an alert and
    stored, each time saying what is missing, never left to one quiet log line."""
    from trainer.metrics import TrainerMetrics

    names = await add_policies(own_database_url, tmp_path, [1], engine_url=stub_url)
    monkeypatch.setenv("RUNS_FILE", str(tmp_path / "runs.txt"))
    monkeypatch.setenv("SCORES", json.dumps({BASE: 0.5, names[1]: 0.9}))
    metrics = TrainerMetrics()
    gate = build_gate(TrainerSettings(database_url=own_database_url, upstreams=(stub_url,), metrics_port=None,
                                      gate="command", eval_command=user_script("exit", only=BASE)), metrics=metrics)
    with caplog.at_level("ERROR", logger="rlproxy.gates"):
        assert await gate(1) is False  # 0.9, but against nothing
    reason = (await policy_evaluation(own_database_url, 1))[KEY]["reason"]
    assert reason.startswith("the parent v0 could not be scored (exited with status 3: could not reach the grader)")
    assert "the command gate needs a score of the parent v0" in reason and f"as '{BASE}'" in reason
    [alert] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ALERT command gate")]
    assert reason in alert
    assert metrics.registry.get_sample_value("rlproxy_trainer_gate_parent_unscored_total", {"why": "exit"}) == 1.0


def test_a_command_with_an_unknown_placeholder_is_refused_before_anything_runs(own_database_url, stub_url):
    with pytest.raises(EvalCommandError, match=r"unknown placeholder\(s\) url; known: \{base_url\}"):
        command_gate(own_database_url, stub_url, "python eval.py --url {url}")
    done = subprocess.run([sys.executable, "-m", "rlproxy.cli", "train", "--upstream", stub_url, "--gate", "command",
                           "--database-url", own_database_url], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--gate command needs --eval-command" in done.stderr


def rlproxy_eval(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "rlproxy.cli", "eval", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})


def test_rlproxy_eval_runs_the_users_command_and_says_which_set_the_number_is_from(
        own_database_url, stub_url, tmp_path):
    [v1] = asyncio.run(add_policies(own_database_url, tmp_path, [1])).values()  # v1's adapter name
    env = {"RUNS_FILE": str(tmp_path / "runs.txt"), "SCORES": json.dumps({v1: 0.25})}
    done = rlproxy_eval("--policy", "v1", "--command", user_script(), "--upstream", stub_url,
                        "--database-url", own_database_url, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "v1: score 0.25 over 20 on the held-out set (split=heldout)" in done.stdout
    again = rlproxy_eval("--policy", "v1", "--command", user_script(), "--split", "gate", "--upstream", stub_url,
                         "--database-url", own_database_url, env=env)
    assert "on the gate's decision set (split=gate)" in again.stdout
    kept = asyncio.run(policy_evaluation(own_database_url, 1))["command_eval"]
    assert kept["heldout"]["score"] == 0.25 and kept["gate"]["n"] == 20
    assert runs(tmp_path / "runs.txt") == [f"{v1} heldout", f"{v1} gate"]
    failing = rlproxy_eval("--policy", "v1", "--command", user_script("exit"), "--upstream", stub_url,
                           "--database-url", own_database_url, env=env)
    assert failing.returncode == 1 and "exited with status 3" in failing.stderr


# --- evaluation traffic --------------------------------------------------------------------------------------


async def users_episode(http: aiohttp.ClientSession, proxy: str, *, evaluation: str | None, reward_by_version,
                        agent: str = "support-bot") -> int:
    """One rollout of the user's agent: opened with POST /rollouts (as evaluation or not), one call, a reward.
    `evaluation`: "create" (POST /rollouts {"eval": true}), "header" (X-Rlproxy-Eval on the call) or None."""
    async with http.post(f"{proxy}/rollouts", json={"task_id": "ticket", "agent": agent,
                                                   "eval": evaluation == "create"}) as response:
        created = await response.json()
    headers = {"X-Rlproxy-Eval": "1"} if evaluation == "header" else {}
    client = openai.AsyncOpenAI(base_url=created["base_url"], api_key="unused", max_retries=0,
                                default_headers=headers)
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model=BASE, messages=[{"role": "user", "content": "my order is late"}])
    finally:
        await client.close()
    version = int(raw.headers["X-Rlproxy-Policy"])
    # an evaluation rollout's reward is its grader's (the token POST /rollouts answered): the others' are the
    # agent's, served as evaluation traffic but no evidence for the gate
    grader = {"Authorization": f"Bearer {created['grader_token']}"} if created.get("grader_token") else {}
    async with http.post(f"{proxy}/reward", json={"rollout_id": created["rollout_id"],
                                                  "reward": reward_by_version[version]}, headers=grader) as response:
        assert response.status == 200 and "claim" not in await response.json(), await response.text()
    return version


async def test_the_eval_traffic_gate_proves_a_candidate_on_evaluation_rollouts_only(
        own_database_url, stub_url, tmp_path):
    await add_policies(own_database_url, tmp_path, [1, 2], active=1, engine_url=stub_url)
    settings = TrainerSettings(database_url=own_database_url, metrics_port=None, poll_interval=0.1,
                               gate="eval-traffic", eval_fraction=0.5, canary_min_rollouts=16, gate_margin=0.1,
                               training=TrainingSettings(eval_agents=["grader"]))
    # 16 candidate rollouts before the decision, from the evaluation rollouts created as such (the only ones
    # whose reward an evaluation credential gives): about 32 rounds, so each way of marking evaluation traffic
    # meets both versions of the random half-and-half split
    gate = build_gate(settings)
    assert isinstance(gate, CanaryGate)
    rewards = {2: 1.0, 1: 0.25}
    with running_proxy([stub_url], own_database_url, tmp_path) as proxy:
        decision = asyncio.create_task(gate(2))
        while (await policy_row(own_database_url, 2)).status != "canary":
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.5)  # the proxy's next policy refresh (every second)
        async with aiohttp.ClientSession() as http:
            seen: dict[str, set[int]] = {"create": set(), "header": set(), "grader": set(), "production": set()}
            deadline = time.monotonic() + 60
            while not decision.done() and time.monotonic() < deadline:
                for kind in ("create", "header", "grader", "production"):
                    version = await users_episode(
                        http, proxy, evaluation=kind if kind in ("create", "header") else None,
                        agent="grader" if kind == "grader" else "support-bot", reward_by_version=rewards)
                    if kind != "production" or not decision.done():  # once promoted, it is everyone's
                        seen[kind].add(version)
            promoted = await asyncio.wait_for(decision, 30)
    assert promoted is True  # 1.0 vs 0.25 on the same period's evaluation rollouts
    # every way of marking evaluation traffic reached the candidate; production traffic never did
    assert seen["create"] == seen["header"] == seen["grader"] == {1, 2}
    assert seen["production"] == {1}
    record = (await policy_evaluation(own_database_url, 2))["canary"]
    assert record["traffic"] == "eval" and record["fraction"] == 0.5 and record["eval_agents"] == ["grader"]
    assert record["rollouts"] >= 16 and record["mean_reward"] == 1.0 and record["active_mean_reward"] == 0.25
    assert (await policy_row(own_database_url, 2)).status == "active"

    done = rlproxy_eval("--policy", "v2", "--traffic", "--database-url", own_database_url)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("v2: evaluation traffic mean reward 1 over ")
    assert lines[1].startswith("v1: evaluation traffic mean reward 0.25 over ")
    assert lines[2].startswith(f"the eval-traffic gate decided on {record['rollouts']} of v2's evaluation rollouts")


def test_a_canary_scope_is_read_back_as_written():
    canary = canaries._parse(3, "rlproxy-v3", {
        "fraction": 0.5, "started_at": "2026-01-01T00:00:00+00:00", "parent": 2, "traffic": "eval",
        "eval_agents": ["grader"]})
    assert canary.traffic == canaries.EVAL and canary.eval_agents == ("grader",)
    rollout = next(f"r{i}" for i in range(100) if canaries.serves(canary, f"r{i}"))
    assert canary.answers(rollout, evaluation=True) and not canary.answers(rollout, evaluation=False)
    old = canaries._parse(3, "rlproxy-v3", {"fraction": 0.5, "started_at": "2026-01-01T00:00:00"})
    assert old.traffic == canaries.ALL and old.answers(rollout, evaluation=False)
