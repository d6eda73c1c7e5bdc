"""The database stops under steady load and starts again: no agent sees an error, and every call reaches the
database exactly once (spooled locally meanwhile). The outage lasts `RLPROXY_FAULT_OUTAGE_SECONDS` (12 s by
default, to keep the test short; the behaviour does not depend on the length)."""
from __future__ import annotations

import os
import time

import pytest
import requests

from tests.faults.probes import readyz, wait_until
from tests.faults.traffic import Traffic, settle, tally
from tests.support import running_proxy

OUTAGE_SECONDS = float(os.environ.get("RLPROXY_FAULT_OUTAGE_SECONDS", "12"))


def spool_metric(url: str) -> float:
    text = requests.get(url + "/metrics", timeout=5).text
    return float(next(line.split()[-1] for line in text.splitlines()
                      if line.startswith("rlproxy_capture_spool_pending ")))


@pytest.mark.parametrize("durability", ["batch", "sync"])
def test_a_database_outage_under_load_loses_nothing(stub_url, private_postgres, private_database_url,
                                                    tmp_path, durability):
    proxy = running_proxy([stub_url], private_database_url, tmp_path, "proxy", "--durability", durability)
    with proxy as url:
        with Traffic(url) as traffic:
            time.sleep(3)
            private_postgres.stop()
            stopped = time.monotonic()
            during = wait_until(lambda: (r := readyz(url))["spool"]["pending"] and r, timeout=OUTAGE_SECONDS)
            spooled = spool_metric(url)
            time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - stopped)))
            private_postgres.start()
            time.sleep(4)
        acknowledged_at_stop = len(traffic.acknowledged)
        after = wait_until(lambda: (r := requests.get(url + "/readyz", timeout=10)).status_code == 200
                           and r.json()["spool"]["pending"] == 0 and r.json(), timeout=30)
        settle(url, traffic)
        result = tally(traffic, private_database_url)
    result.show(f"database outage of {OUTAGE_SECONDS:.0f} s, durability={durability}")
    print(f"  spooled during the outage (readyz): {during['spool']['pending']}, metric: {spooled:.0f}")

    assert during["status"] == "ready" and during["database"] is False and during["spool"]["spooling"]
    assert spooled > 0
    assert after["database"] is True and after["spool"] == dict(after["spool"], pending=0, spooling=False)
    assert acknowledged_at_stop > 20 and result.client_errors == {}
    assert result.lost == 0 and result.stored == result.acknowledged == result.sent
    assert result.bad_rollouts == []


def test_reads_and_reports_while_the_database_is_down_are_503_never_500(stub_url, private_postgres,
                                                                         private_database_url, tmp_path):
    """What the proxy cannot answer without the database is "try again shortly" (503 store_unavailable,
    Retry-After), not an internal error: agents' clients and the web view retry a 503."""
    with running_proxy([stub_url], private_database_url, tmp_path, "proxy") as url:
        rollout = requests.post(url + "/rollouts", json={"task_id": "t"}, timeout=10).json()
        private_postgres.stop()
        try:
            answers = {path: requests.get(url + path, timeout=30) for path in
                       ("/policies", "/ui/api/rollouts", "/ui/api/tasks/t", f"/rollouts/{rollout['rollout_id']}")}
            answers["POST /reward"] = requests.post(url + "/reward", json={"rollout_id": rollout["rollout_id"],
                                                                          "reward": 1.0}, timeout=30)
        finally:
            private_postgres.start()
    for what, answer in answers.items():
        assert answer.status_code == 503, (what, answer.status_code, answer.text)
        assert answer.json()["error"]["code"] == "store_unavailable", (what, answer.text)
        assert answer.headers.get("Retry-After"), what
