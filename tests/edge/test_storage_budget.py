"""A project's keys may make the proxy store at most `--project-bytes-per-hour`: one key within every per-request
bound stored about 14 GiB an hour. What was accepted is stored whole (the request that passes the budget
included); the project's next requests are 429 in the route's format with Retry-After, counted in
`rlproxy_storage_budget_refused_total`; other projects are not held up."""
from __future__ import annotations

import uuid

import requests

from testkit.stub_engine import BASE_MODEL
from tests.support import make_key, running_proxy

OPERATOR = "operator-key-of-the-budget-test"
BUDGET = 300_000


def chat(size: int) -> dict:
    return {"model": BASE_MODEL, "max_tokens": 4,
            "messages": [{"role": "user", "content": (uuid.uuid4().hex * (size // 32 + 1))[:size]}]}


def test_a_project_past_its_storage_budget_is_told_to_wait_and_loses_nothing(stub_url, own_database_url, tmp_path):
    alpha, beta = make_key(own_database_url, "alpha"), make_key(own_database_url, "beta")
    rollout = uuid.uuid4().hex
    with running_proxy([stub_url], own_database_url, tmp_path, "budget",
                       "--project-bytes-per-hour", str(BUDGET), env={"RLPROXY_ADMIN_KEY": OPERATOR}) as url:
        calls = f"{url}/rollouts/{rollout}/v1/chat/completions"
        as_alpha = {"Authorization": f"Bearer {alpha}"}
        first = requests.post(calls, json=chat(200_000), headers=as_alpha, timeout=30)
        second = requests.post(calls, json=chat(200_000), headers=as_alpha, timeout=30)  # passes the budget
        assert (first.status_code, second.status_code) == (200, 200)

        refused = requests.post(calls, json=chat(100), headers=as_alpha, timeout=30)
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
        assert refused.json()["error"]["code"] == "storage_budget_exceeded"
        assert "--project-bytes-per-hour" in refused.json()["error"]["message"]
        created = requests.post(f"{url}/rollouts", json={"metadata": {"note": "x"}}, headers=as_alpha, timeout=30)
        assert created.status_code == 429  # metadata is stored too
        messages = requests.post(f"{url}/v1/messages", headers={"x-api-key": alpha}, timeout=30,
                                 json={"model": BASE_MODEL, "max_tokens": 4, "messages": [{"role": "user",
                                                                                           "content": "hi"}]})
        assert messages.status_code == 429 and messages.json()["type"] == "error"  # Anthropic's shape

        assert requests.post(f"{url}/v1/chat/completions", json=chat(100), timeout=30,
                             headers={"Authorization": f"Bearer {beta}"}).status_code == 200
        stored = requests.get(f"{url}/rollouts/{rollout}", headers=as_alpha, timeout=30).json()
        assert [c["status"] for c in stored["calls"]] == ["ok", "ok"]  # both accepted calls, whole
        assert len(stored["calls"][1]["request"]["messages"][0]["content"]) == 200_000
        metrics = requests.get(f"{url}/metrics", headers={"Authorization": f"Bearer {OPERATOR}"}, timeout=30).text
        assert "rlproxy_storage_budget_refused_total 3.0" in metrics
