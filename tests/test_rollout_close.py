"""`POST /rollouts/{id}/close`: an agent that posts no reward says it is done, and its rollout closes as the
trainer's idle close would (a policy with a teacher trains it from the teacher: docs/distillation.md). Against a
real proxy with keys on (tests/tenants.py). Only those who give a rollout's reward end it: the agent of a rollout
its verifier grades cannot close it before the verdict (its close is a claim, counted)."""
from __future__ import annotations

import re

import requests

from testkit.stub_engine import BASE_MODEL

CHAT = {"model": BASE_MODEL, "messages": [{"role": "user", "content": "What is 6*7?"}], "max_tokens": 4}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def create(tenants, **body) -> dict:
    answer = requests.post(f"{tenants.url}/rollouts", json={"task_id": "t-close", **body},
                           headers=tenants.headers("alpha"))
    assert answer.status_code == 201, answer.text
    return answer.json()


def close(tenants, rollout_id: str, token: str, **kwargs) -> requests.Response:
    return requests.post(f"{tenants.url}/rollouts/{rollout_id}/close", headers=bearer(token), **kwargs)


def summary(tenants, rollout_id: str) -> dict:
    answer = requests.get(f"{tenants.url}/rollouts/{rollout_id}", params={"calls": "false"},
                          headers=tenants.headers("operator"))
    assert answer.status_code == 200, answer.text
    return answer.json()


def close_claims(tenants) -> float:
    text = requests.get(f"{tenants.url}/metrics", headers=tenants.headers("operator")).text
    found = re.search(r'^rlproxy_reward_claims_total{giver="agent",kind="close"} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def test_an_agent_closes_its_rollout_without_a_reward_and_no_reward_is_taken_after(tenants):
    rollout = create(tenants)
    token, rollout_id = rollout["token"], rollout["rollout_id"]
    called = requests.post(f"{rollout['base_url']}/chat/completions", json=CHAT, headers=bearer(token))
    assert called.status_code == 200, called.text

    closed = close(tenants, rollout_id, token)
    assert closed.status_code == 200, closed.text
    assert closed.json() == {"rollout_id": rollout_id, "status": "finished", "closed": True, "claim": False}
    stored = summary(tenants, rollout_id)
    assert stored["status"] == "finished" and stored["reward"] is None and stored["finished_at"]

    again = close(tenants, rollout_id, token, json={})  # the same close again changes nothing
    assert again.status_code == 200 and again.json()["closed"] is False
    late = requests.post(f"{tenants.url}/reward", json={"rollout_id": rollout_id, "reward": 1.0},
                         headers=bearer(token))
    assert late.status_code == 409, late.text
    assert summary(tenants, rollout_id)["reward"] is None


def test_a_graded_rollout_is_closed_by_its_grader_alone(tenants):
    rollout = create(tenants, reward_source="grader")
    rollout_id = rollout["rollout_id"]
    before = close_claims(tenants)

    by_agent = close(tenants, rollout_id, rollout["token"])
    assert by_agent.status_code == 200, by_agent.text
    assert by_agent.json() == {"rollout_id": rollout_id, "status": "open", "closed": False, "claim": True}
    assert summary(tenants, rollout_id)["status"] == "open"
    assert close_claims(tenants) == before + 1

    by_grader = close(tenants, rollout_id, rollout["grader_token"])
    assert by_grader.status_code == 200 and by_grader.json()["closed"] is True
    assert summary(tenants, rollout_id)["status"] == "finished"


def test_a_close_names_no_other_rollout_and_takes_no_fields(tenants):
    mine, mate = create(tenants), create(tenants)
    hidden = close(tenants, mate["rollout_id"], mine["token"])  # a group mate's, with my token: as an unused id
    assert hidden.status_code == 404, hidden.text
    assert hidden.json()["error"]["message"] == f"rollout {mate['rollout_id']!r} does not exist"
    assert summary(tenants, mate["rollout_id"])["status"] == "open"

    refused = close(tenants, mine["rollout_id"], mine["token"], json={"reward": 1.0})
    assert refused.status_code == 422, refused.text
    assert summary(tenants, mine["rollout_id"])["status"] == "open"
