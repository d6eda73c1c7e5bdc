"""Zero-downtime adapter swaps against the real engine: agents keep calling through the proxy while six
versions are published one after another (and older ones unloaded); no request fails or stalls, each
version serves, and every call is recorded with the version that served it."""
from __future__ import annotations

import asyncio

import pytest
import requests

from engine.model import prepare_model
from testkit.swap_load import make_adapter_versions, swap_under_load
from tests.support import running_proxy

pytestmark = pytest.mark.engine
pytest.importorskip("torch")

VERSIONS = 6


def test_six_swaps_under_load_lose_no_request(engine_url, engine_model, own_database_url, tmp_path):
    adapters = make_adapter_versions(prepare_model(), tmp_path / "adapters", VERSIONS)
    with running_proxy([engine_url], own_database_url, tmp_path) as proxy:
        report = asyncio.run(swap_under_load(proxy, engine_url, engine_model, own_database_url, adapters))
        print(report.summary())
        recorded = {rollout: requests.get(f"{proxy}/rollouts/{rollout}").json()
                    for rollout in report.requests_by_rollout}
        names = {p["version"]: p["name"] for p in requests.get(f"{proxy}/policies").json()["data"]}
    loaded = {m["id"] for m in requests.get(f"{engine_url}/v1/models").json()["data"]}

    assert report.failures == []
    assert report.requests >= 40 and max(report.latencies) < 60  # nothing stalled
    assert set(report.served_versions) >= set(range(1, VERSIONS + 1))  # every version served (0: the base)
    assert len(report.publish_to_serving) == VERSIONS
    for rollout, sent in report.requests_by_rollout.items():
        calls = recorded[rollout]["calls"]
        assert len(calls) == sent and all(call["status"] == "ok" for call in calls)
        assert [call["policy"] for call in calls] == report.versions_by_rollout[rollout]  # stamped as served
    assert names[VERSIONS] in loaded  # each version's adapter name, as GET /policies shows it
    assert not {names[v] for v in range(1, VERSIONS - 1)} & loaded  # drained versions were unloaded
