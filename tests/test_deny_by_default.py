"""Inputs and answers that were let through because nothing said no, each now refused or narrowed at the
boundary, against the two-tenant proxy (tests/tenants.py: alpha's adapter is `rlproxy-v1-<random>`, beta's
`rlproxy-v2-<random>`, `tenants.adapters`).

- A query string on a relayed engine route was relayed as it came: the one input that skipped the request
  boundary (`POST /tokenize?model=<beta's adapter>` with alpha's key reached the engine naming it). No
  relayed route reads a query parameter, so a request carrying one is refused, naming it, and reaches nothing.
- `GET /metrics` (every policy's versions and reward histograms) and `/readyz`'s details (the engines' addresses,
  the spool's path) were shown to a project's admin key. They are the operator's: a project's admin key gets 403
  on `/metrics` and from `/readyz` what a probe without a key gets."""
from __future__ import annotations

import json

import requests

from tests.tenants import received, send

# `{beta}`: beta's adapter name
QUERIED = ["/tokenize?model={beta}", "/rollouts/{rid}/agents/solver/tokenize?model={beta}",
           "/v1/embeddings?model={beta}&input=x", "/tokenize?add_special_tokens=false"]


def test_a_query_string_on_a_relayed_route_is_refused_by_name_and_reaches_nothing(tenants):
    rid = tenants.rollout("alpha")["rollout_id"]
    alpha = tenants.keys["alpha"]
    tenants.stub.received.clear()

    answers = {target: send(tenants.url, "POST", target.format(rid=rid, **tenants.adapters), alpha)
               for target in QUERIED}
    health = send(tenants.url, "GET", "/health?verbose=1", alpha)
    nameless = send(tenants.url, "POST", "/tokenize?&", alpha)

    assert received(tenants) == []
    for target, (status, body) in [*answers.items(), ("/health?verbose=1", health), ("/tokenize?&", nameless)]:
        assert status == 400, (target, body)
        error = json.loads(body)["error"]
        assert error["code"] == "unknown_parameter" and error["type"] == "invalid_request_error", error
    error = json.loads(answers["/tokenize?model={beta}"][1])["error"]
    assert error["param"] == "model"
    assert error["message"].startswith("Unknown query parameter: 'model'. /tokenize takes no query parameters")
    assert json.loads(health[1])["error"]["param"] == "verbose"

    # the same calls without a query (a bare `?` carries none) are relayed, and the engine gets the path alone
    assert send(tenants.url, "POST", "/tokenize?", alpha)[0] == 200
    assert send(tenants.url, "GET", "/health", alpha)[0] == 200
    assert received(tenants) == [("POST", "/tokenize"), ("GET", "/health")]


def test_a_query_string_is_still_no_way_past_the_key_or_the_tenant_scope(tenants):
    rid = tenants.rollout("alpha")["rollout_id"]
    tenants.stub.received.clear()
    assert send(tenants.url, "POST", "/tokenize?model=x", None)[0] == 401  # who is asking comes first
    # another project's id answers as an unused one does: the query string is refused either way
    unused = send(tenants.url, "POST", "/rollouts/never-used/tokenize?model=x", tenants.keys["beta"])
    assert send(tenants.url, "POST", f"/rollouts/{rid}/tokenize?model=x", tenants.keys["beta"]) == unused
    assert unused[0] == 400
    assert received(tenants) == []


def readyz(tenants, who: str | None) -> requests.Response:
    headers = {"Authorization": f"Bearer {tenants.keys.get(who, who)}"} if who else {}
    return requests.get(f"{tenants.url}/readyz", headers=headers, timeout=10)


def test_readyz_details_are_the_operators_and_every_other_caller_gets_what_a_probe_gets(tenants):
    probe = readyz(tenants, None)  # Kubernetes' readiness probe: no key
    assert probe.status_code == 200 and probe.json() == {"status": "ready"}

    for who in ("alpha", "alpha-admin", "beta-admin", "rlp_" + "x" * 43, "not-a-key"):
        answer = readyz(tenants, who)
        assert (answer.status_code, answer.json()) == (200, {"status": "ready"}), who
        assert tenants.stub_url not in answer.text

    operator = readyz(tenants, "operator").json()
    assert operator["status"] == "ready"
    assert operator["engines"] == {tenants.stub_url: True}
    assert operator["spool"]["path"]  # where the spool lies: the operator's to know


def test_metrics_are_read_with_the_operator_key_only(tenants):
    metrics = f"{tenants.url}/metrics"

    assert requests.get(metrics, timeout=10).status_code == 401
    for who in ("alpha", "alpha-admin", "beta-admin"):
        refused = requests.get(metrics, headers=tenants.headers(who), timeout=10)
        assert refused.status_code == 403, who
        error = refused.json()["error"]
        assert error["type"] == "permission_error" and "operator key" in error["message"]
        assert "rlproxy_" not in refused.text  # not one series

    scraped = requests.get(metrics, headers=tenants.headers("operator"), timeout=10)  # as Prometheus scrapes
    assert scraped.status_code == 200 and scraped.headers["Content-Type"].startswith("text/plain")
    assert "rlproxy_capture_queue_depth" in scraped.text
