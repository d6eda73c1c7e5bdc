"""A rollout's own credentials against a real proxy with keys on (tests/tenants.py: projects alpha and beta, a stub
engine, Postgres) and one with keys off: the token `POST /rollouts` answers reaches its own rollout alone, a
rollout whose grader gives its reward keeps what anyone else posts as a claim, and evaluation rollouts (and the
figures `GET /policies` reports from them) take only evaluation credentials. Each of these is what an agent with
a project key did before: list the open rollouts, set its group mates' rewards, create and reward evaluation
rollouts, move the held-out figures."""
from __future__ import annotations

import json
import os
import re
import sys
import uuid

import pytest
import requests
from click.testing import CliRunner

from store import rollouts as store_rollouts
from store import training
from store.models import RewardKind
from store.reward_sources import RewardedBy, RewardSource
from rlproxy.cli import main
from testkit.stub_engine import BASE_MODEL
from tests.support import ROOT, running_proxy, transaction

CHAT = {"model": BASE_MODEL, "messages": [{"role": "user", "content": "What is 6*7?"}], "max_tokens": 4}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def create(url: str, headers: dict[str, str], **body) -> dict:
    answer = requests.post(f"{url}/rollouts", json={"task_id": "t-group", **body}, headers=headers)
    assert answer.status_code == 201, answer.text
    return answer.json()


def reward(url: str, headers: dict[str, str], rollout_id: str, value: float, **body) -> requests.Response:
    return requests.post(f"{url}/reward", json={"rollout_id": rollout_id, "reward": value, **body}, headers=headers)


def claims_counted(tenants, giver: str) -> float:
    text = requests.get(f"{tenants.url}/metrics", headers=tenants.headers("operator")).text
    found = re.search(rf'^rlproxy_reward_claims_total{{giver="{giver}",kind="final"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_rollout_token_reaches_its_own_rollout_and_nothing_else(tenants):
    mine, mate = create(tenants.url, tenants.headers("alpha")), create(tenants.url, tenants.headers("alpha"))
    assert mine["token"].startswith("rlr_") and mine["token"] != mate["token"]
    assert mine["reward_source"] == "agent" and mine["grader_token"] is None
    token, own, other = bearer(mine["token"]), mine["rollout_id"], mate["rollout_id"]

    # its own calls are recorded: under its base URL, and bare with X-Rollout-Id
    assert requests.post(f"{mine['base_url']}/chat/completions", json=CHAT, headers=token).status_code == 200
    bare = requests.post(f"{tenants.url}/v1/chat/completions", json=CHAT, headers={**token, "X-Rollout-Id": own})
    assert bare.status_code == 200, bare.text
    assert requests.get(f"{tenants.url}/rollouts/{own}/v1/models", headers=token).status_code == 200
    assert len(requests.get(f"{tenants.url}/rollouts/{own}", headers=token).json()["calls"]) == 2

    # its group mate (same project, same task) is an unused id to it: no call, no reward, no read
    unseen = f"rollout {other!r} does not exist"
    for answer in (reward(tenants.url, token, other, 0.0),
                   requests.get(f"{tenants.url}/rollouts/{other}", headers=token),
                   requests.post(f"{tenants.url}/rollouts/{other}/events", headers=token,
                                 json={"event_type": "reward", "data": {"value": 0.0}}),
                   requests.post(f"{tenants.url}/rollouts/{other}/v1/chat/completions", json=CHAT, headers=token),
                   requests.post(f"{tenants.url}/v1/chat/completions", json=CHAT,
                                 headers={**token, "X-Rollout-Id": other})):
        assert answer.status_code == 404 and answer.json()["error"]["message"] == unseen, answer.text
    assert requests.get(f"{tenants.url}/rollouts/{other}", headers=tenants.headers("alpha")).json()["status"] == "open"

    # every route that is not its rollout's: listing, creating, evaluation, policies, spans, metrics
    refused = {
        "list": requests.get(f"{tenants.url}/ui/api/rollouts", params={"status": "open"}, headers=token),
        "create": requests.post(f"{tenants.url}/rollouts", json={}, headers=token),
        "create eval": requests.post(f"{tenants.url}/rollouts", json={"eval": True}, headers=token),
        "policies": requests.get(f"{tenants.url}/policies", headers=token),
        "activate": requests.post(f"{tenants.url}/policies/1/activate", headers=token),
        "traces": requests.post(f"{tenants.url}/v1/traces", json={"resourceSpans": []}, headers=token),
        "metrics": requests.get(f"{tenants.url}/metrics", headers=token),
        "bare call": requests.post(f"{tenants.url}/v1/chat/completions", json=CHAT, headers=token),
    }
    assert {name: answer.status_code for name, answer in refused.items()} == dict.fromkeys(refused, 403)
    assert refused["bare call"].json()["error"]["code"] == "rollout_token_scope"
    assert "its own rollout alone" in refused["list"].json()["error"]["message"]

    # its own reward (the agent gives it: reward_source agent) closes its own rollout
    assert reward(tenants.url, token, own, 0.75).json() == {"rollout_id": own, "reward": 0.75}
    closed = requests.get(f"{tenants.url}/rollouts/{own}", headers=token).json()  # still readable once finished
    assert (closed["status"], closed["reward"], closed["rewarded_by"]) == ("finished", 0.75, "agent")


def test_the_graders_reward_is_final_and_everyone_elses_a_claim(tenants):
    before = claims_counted(tenants, "agent")
    created = create(tenants.url, tenants.headers("alpha"), reward_source="runner")
    rollout_id, token = created["rollout_id"], bearer(created["token"])
    assert created["reward_source"] == "grader" and created["grader_token"].startswith("rlg_")
    assert requests.post(f"{created['base_url']}/chat/completions", json=CHAT, headers=token).status_code == 200

    # the agent's token, the events URL and a plain key of the project: each answered 2xx, each a claim
    posted = reward(tenants.url, token, rollout_id, 1.0)
    assert posted.status_code == 200 and posted.json() == {"rollout_id": rollout_id, "reward": 1.0, "claim": True}
    event = requests.post(f"{tenants.url}/rollouts/{rollout_id}/events", headers=token,
                          json={"event_type": "reward", "data": {"value": 1.0}})
    assert event.status_code == 200 and event.json()["claim"] is True
    assert reward(tenants.url, tenants.headers("alpha"), rollout_id, 1.0).json()["claim"] is True
    [call] = requests.get(f"{tenants.url}/rollouts/{rollout_id}", headers=token).json()["calls"]
    per_call = reward(tenants.url, token, rollout_id, 1.0, call_id=call["call_id"])  # a claim for one call, too
    assert per_call.json() == {"rollout_id": rollout_id, "reward": 1.0, "call_id": call["call_id"], "claim": True}
    assert requests.get(f"{tenants.url}/rollouts/{rollout_id}", headers=token).json()["status"] == "open"

    # the grader's word closes it; a claim after it changes nothing
    graded = reward(tenants.url, bearer(created["grader_token"]), rollout_id, 0.0)
    assert graded.status_code == 200 and graded.json() == {"rollout_id": rollout_id, "reward": 0.0}
    assert reward(tenants.url, token, rollout_id, 1.0).json()["claim"] is True
    stored = requests.get(f"{tenants.url}/rollouts/{rollout_id}", headers=tenants.headers("alpha")).json()
    assert (stored["status"], stored["reward"], stored["rewarded_by"]) == ("finished", 0.0, "grader")
    kinds = [(entry["kind"], entry["claim"], entry["value"], entry["reason"]) for entry in stored["rewards"]]
    assert sorted(kinds) == sorted([("claim", True, 1.0, "agent")] * 5 + [("final", False, 0.0, None)])
    assert claims_counted(tenants, "agent") == before + 4

    # an admin key of the project gives such a reward too; another rollout's grader token does not
    other = create(tenants.url, tenants.headers("alpha"), reward_source="grader")
    assert reward(tenants.url, bearer(created["grader_token"]), other["rollout_id"], 1.0).status_code == 404
    assert reward(tenants.url, tenants.headers("alpha-admin"), other["rollout_id"], 0.5).json() == {
        "rollout_id": other["rollout_id"], "reward": 0.5}


def alpha_traffic(tenants) -> dict:
    listed = requests.get(f"{tenants.url}/policies", params={"policy": "alpha"}, headers=tenants.headers("alpha"))
    return {row["version"]: row["evaluation_traffic"] for row in listed.json()["data"]}


def test_evaluation_rollouts_and_their_figures_take_only_evaluation_credentials(tenants):
    refused = requests.post(f"{tenants.url}/rollouts", json={"eval": True}, headers=tenants.headers("alpha"))
    assert refused.status_code == 403 and refused.json()["error"]["param"] == "eval"
    assert "--eval" in refused.json()["error"]["message"]
    for who in ("alpha-admin", "alpha-eval", "operator"):
        assert create(tenants.url, tenants.headers(who), eval=True)["reward_source"] == "grader"

    figures = alpha_traffic(tenants)
    evaluations = [create(tenants.url, tenants.headers("alpha-eval"), eval=True) for _ in range(3)]
    for rollout in evaluations:  # the agents of each, and a plain project key, post 1.0: claims
        token = bearer(rollout["token"])
        assert requests.post(f"{rollout['base_url']}/chat/completions", json=CHAT, headers=token).status_code == 200
        assert reward(tenants.url, token, rollout["rollout_id"], 1.0).json()["claim"] is True
        assert reward(tenants.url, tenants.headers("alpha"), rollout["rollout_id"], 1.0).json()["claim"] is True
    assert alpha_traffic(tenants) == figures  # the held-out figures did not move

    # the rollout's grader token, an evaluation key and an admin key give the evidence
    graders = [bearer(evaluations[0]["grader_token"]), tenants.headers("alpha-eval"), tenants.headers("alpha-admin")]
    for rollout, headers in zip(evaluations, graders):
        assert reward(tenants.url, headers, rollout["rollout_id"], 0.0).json() == {
            "rollout_id": rollout["rollout_id"], "reward": 0.0}
    version = requests.get(f"{tenants.url}/rollouts/{evaluations[0]['rollout_id']}",
                           headers=tenants.headers("alpha")).json()["policy"]
    counted = alpha_traffic(tenants)[version]
    assert counted["n"] == (figures[version] or {"n": 0})["n"] + 3


@pytest.fixture
def open_proxy(stub_url, own_database_url, tmp_path):
    """A proxy with keys off (no key anywhere, loopback): every local process is trusted, as before."""
    with running_proxy([stub_url], own_database_url, tmp_path, "proxy-open") as url:
        yield url


def test_with_keys_off_a_token_is_held_to_its_rollout_and_only_the_grader_settles(open_proxy):
    created = create(open_proxy, {}, reward_source="grader")
    rollout_id, token = created["rollout_id"], bearer(created["token"])
    assert requests.get(f"{open_proxy}/ui/api/rollouts").status_code == 200  # no credential: open as before
    assert requests.get(f"{open_proxy}/ui/api/rollouts", headers=token).status_code == 403
    assert requests.post(f"{open_proxy}/rollouts", json={"eval": True}, headers=token).status_code == 403
    assert requests.get(f"{open_proxy}/rollouts/{uuid.uuid4().hex}", headers=token).status_code == 404
    assert requests.get(f"{open_proxy}/rollouts/x", headers=bearer("rlr_" + "x" * 43)).status_code == 401

    # "everyone is the operator" does not settle a graded rollout: only its grader token does
    assert reward(open_proxy, {}, rollout_id, 1.0).json()["claim"] is True
    assert reward(open_proxy, token, rollout_id, 1.0).json()["claim"] is True
    assert reward(open_proxy, bearer(created["grader_token"]), rollout_id, 0.25).json() == {
        "rollout_id": rollout_id, "reward": 0.25}
    assert requests.get(f"{open_proxy}/rollouts/{rollout_id}").json()["reward"] == 0.25

    evaluation = create(open_proxy, {}, eval=True)  # keys off: any local caller may create one ...
    assert reward(open_proxy, {}, evaluation["rollout_id"], 1.0).json()["claim"] is True  # ... not reward it


async def test_a_claim_is_never_trained_on(own_database_url):
    """The trainer's reads: a rollout that holds only claims is open (never ready), and once its grader gave its
    reward, the claims beside it are not rewards of it or of its calls."""
    rollout_id = uuid.uuid4().hex
    async with transaction(own_database_url) as session:
        await store_rollouts.create_rollout(session, rollout_id, task_id="t", reward_source=RewardSource.GRADER)
    async with transaction(own_database_url) as session:
        claimed = await store_rollouts.post_reward(session, rollout_id, 1.0, giver=RewardedBy.AGENT)
        assert claimed.claim and claimed.created
    async with transaction(own_database_url) as session:
        assert await training.ready_rollouts(session, limit=16, group_size=1, group_timeout_s=0) == []
        assert (await training.waiting_rollouts(session)) == 0
    async with transaction(own_database_url) as session:
        await store_rollouts.post_reward(session, rollout_id, 0.0, giver=RewardedBy.GRADER)
    async with transaction(own_database_url) as session:
        assert await training.ready_rollouts(session, limit=16, group_size=1, group_timeout_s=0) == [rollout_id]
        stored = await store_rollouts.get_rollout(session, rollout_id)
    assert stored["reward"] == 0.0
    assert [(entry["kind"], entry["value"]) for entry in stored["rewards"]] == [(RewardKind.CLAIM, 1.0),
                                                                              (RewardKind.FINAL, 0.0)]


HOSTILE = ROOT / "tests" / "scripts" / "hostile_agent.py"


def test_a_hostile_agent_under_rlproxy_run_changes_no_reward_but_its_own_result(tenants, tmp_path):
    """Three attempts of one task at once and an evaluation attempt, each running tests/scripts/hostile_agent.py
    with what the runner gave it; the runner's key is the operator's, the agents' key an evaluation key of alpha
    (the runner creates their rollouts, evaluation ones included, with it; the agents never see it)."""
    shared, out = tmp_path / "shared", tmp_path / "out"
    shared.mkdir(), out.mkdir()
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"id": "hostile", "reward": "0.9"}) + "\n")
    (tmp_path / "eval.jsonl").write_text(json.dumps({"id": "hostile-eval", "reward": "0.2"}) + "\n")
    figures = alpha_traffic(tenants)
    log = tmp_path / "run.jsonl"
    result = CliRunner().invoke(main, [
        "run", "--proxy", tenants.url, "--log", str(log), "--tasks", str(tmp_path / "tasks.jsonl"),
        "--eval-tasks", str(tmp_path / "eval.jsonl"), "--task-id-field", "id", "--attempts", "3",
        "--concurrency", "4", "--command", f"{sys.executable} {HOSTILE}", "--env-map", "HOSTILE_REWARD=reward",
        "--pass-env", "HOSTILE_SHARED", "--pass-env", "HOSTILE_OUT", "--pass-env", "HOSTILE_GROUP"],
        env={"RLPROXY_API_KEY": tenants.keys["operator"], "RLPROXY_AGENT_API_KEY": tenants.keys["alpha-eval"],
             "HOSTILE_SHARED": str(shared), "HOSTILE_OUT": str(out), "HOSTILE_GROUP": "3"},
        catch_exceptions=False)
    assert result.exit_code == 0, result.output
    ended = {entry["rollout_id"]: entry for entry in map(json.loads, log.read_text().splitlines())
             if entry["event"] == "finished"}
    assert sorted((entry["split"], entry["status"], entry["reward"]) for entry in ended.values()) == [
        ("eval", "rewarded", 0.2), ("train", "rewarded", 0.9), ("train", "rewarded", 0.9), ("train", "rewarded", 0.9)]

    tried_mates = 0
    for rollout_id, entry in ended.items():
        seen = json.loads((out / f"{rollout_id}.json").read_text())
        assert {name: seen[name] for name in ("list", "create", "create_eval", "policies", "activate")} == dict.fromkeys(
            ("list", "create", "create_eval", "policies", "activate"), 403), seen
        assert set(seen["mates"]) <= {404}, seen  # its group mates: unused ids to it
        # an attempt that ran while no other was open (the evaluation one may run alone) had no mates to try
        tried_mates += bool(seen["mates"]) and entry["split"] == "train"
        stored = requests.get(f"{tenants.url}/rollouts/{rollout_id}", headers=tenants.headers("operator")).json()
        # the runner posted each printed result: with its own key (the operator's), an evaluation's with its grader
        assert stored["reward"] == entry["reward"] and stored["rewarded_by"] == (
            "grader" if entry["split"] == "eval" else "operator")
        if entry["split"] == "eval":  # its own 1.0 was a claim; the printed 0.2 is the evidence
            assert seen["own_eval"] == [200, {"rollout_id": rollout_id, "reward": 1.0, "claim": True}]
            assert [r["value"] for r in stored["rewards"] if r["claim"]] == [1.0] and entry["claims"] == 1
            version = stored["policy"]
            assert version == 1  # alpha's rollout, served by alpha's policy (tests/tenants.py)
    assert tried_mates, "no training attempt ran beside another: nothing tried a group mate's reward"
    assert "posted a reward of their own" in result.output
    after = alpha_traffic(tenants)[version]
    before = figures[version] or {"n": 0, "mean": 0.0}
    assert after["n"] == before["n"] + 1
    assert after["mean"] * after["n"] == pytest.approx((before["mean"] or 0.0) * before["n"] + 0.2)


def test_under_verify_the_verifiers_reward_wins_over_the_one_the_harness_posts(tenants, tmp_path, monkeypatch):
    """A harness (here a stand-in `claude` on PATH) that posts 1.0 to its events URL while the verifier says 0:
    0 is stored, the 1.0 is kept as a claim, counted, and the run says so."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    harness = bin_dir / "claude"
    harness.write_text(f"#!{sys.executable}\n" + '''import json, os, urllib.request
request = urllib.request.Request(os.environ["ANTHROPIC_BASE_URL"] + "/events", method="POST",
                                 data=json.dumps({"event_type": "reward", "data": {"value": 1.0}}).encode(),
                                 headers={"Authorization": "Bearer " + os.environ["ANTHROPIC_API_KEY"],
                                          "Content-Type": "application/json"})
print(urllib.request.urlopen(request, timeout=30).read().decode())
''')
    harness.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    # the harness found is this one, whatever is installed (runner/harnesses/installed.py prefers the pinned one)
    monkeypatch.setattr("runner.harnesses.base.find_program", lambda name, pin: str(harness))
    before = claims_counted(tenants, "agent")
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"id": "verified", "prompt": "Fix the bug."}) + "\n")
    log = tmp_path / "run.jsonl"
    result = CliRunner().invoke(main, [
        "run", "--proxy", tenants.url, "--log", str(log), "--tasks", str(tmp_path / "tasks.jsonl"),
        "--task-id-field", "id", "--attempts", "1", "--harness", "claude-code", "--verify", "echo 0"],
        env={"RLPROXY_API_KEY": tenants.keys["alpha"]}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    [entry] = [e for e in map(json.loads, log.read_text().splitlines()) if e["event"] == "finished"]
    assert (entry["status"], entry["reward"], entry["claims"]) == ("rewarded", 0.0, 1), entry
    stored = requests.get(f"{tenants.url}/rollouts/{entry['rollout_id']}", headers=tenants.headers("alpha")).json()
    assert (stored["reward"], stored["reward_source"], stored["rewarded_by"]) == (0.0, "grader", "grader")
    assert [(r["kind"], r["value"]) for r in stored["rewards"]] == [("claim", 1.0), ("final", 0.0)]
    assert claims_counted(tenants, "agent") == before + 1
    assert "posted a reward of their own" in result.output
