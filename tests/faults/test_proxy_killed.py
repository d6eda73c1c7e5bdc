"""The proxy is killed (SIGKILL) under load: every call an agent received is in the database exactly once after
the proxy starts again with the same spool, including those the database had not taken yet when it died. In the
default durability (`spool`: written to the spool before the answer), against Postgres and SQLite, and with
`--durability sync`.

`RLPROXY_FAULT_DURABILITY=batch` runs the first test in another mode, to measure what it loses (docs/durability.md).
"""
from __future__ import annotations

import os
import signal
import time

import psycopg
import pytest

from tests.faults.killed_under_load import kill_under_load, numbering, stored
from tests.faults.probes import readyz, wait_until
from tests.faults.traffic import Traffic, libpq, settle, tally
from tests.support import free_port, proxy_command, running


@pytest.mark.parametrize("database", ["postgres", "sqlite"])
def test_every_call_answered_before_a_kill_is_stored_once(stub_url, request, tmp_path, database):
    database_url = request.getfixturevalue("own_database_url" if database == "postgres" else "sqlite_url")
    mode = os.environ.get("RLPROXY_FAULT_DURABILITY")
    began = time.monotonic()
    run = kill_under_load(stub_url, database_url, tmp_path, *(["--durability", mode] if mode else []))
    took = time.monotonic() - began
    ids = run.ids
    found = stored(database_url, ids)
    print(f"\nproxy killed at {run.acknowledged_at_kill} of {len(ids)} acknowledged calls, durability="
          f"{mode or 'default'}, {database}: stored={len(found)} lost={len(ids) - len(found)}; acknowledged but "
          f"not in the database when it died: {run.acknowledged_at_kill - run.stored_at_kill}; calls that got no "
          f"answer (retried): {run.failed}; {took:.1f} s")

    assert run.acknowledged_at_kill - run.stored_at_kill > 0  # the case that matters did happen
    assert len(found) == len(ids) == 2000
    for rollout_id, answered in run.acknowledged.items():
        calls, count = numbering(database_url, rollout_id)
        assert [seq for _, seq in calls] == list(range(1, len(calls) + 1)) and count == len(calls)  # once each
        acknowledged = set(answered)
        assert [call for call, _ in calls if call in acknowledged] == answered  # numbered in the order answered
    assert not list(tmp_path.glob("spool.jsonl*"))  # the second proxy stopped cleanly: everything stored


def test_calls_acknowledged_before_a_kill_survive_it(stub_url, own_database_url, tmp_path):
    spool = tmp_path / "spool.jsonl"

    def proxy():
        port = free_port()
        args = proxy_command(port, [stub_url], own_database_url, "--durability", "sync",
                             "--spool-path", str(spool))
        return running(args, f"http://127.0.0.1:{port}/healthz", log_path=tmp_path / "proxy.log"), port

    server, port = proxy()
    with server as process, psycopg.connect(libpq(own_database_url)) as blocker:
        with Traffic(f"http://127.0.0.1:{port}", pause=0.02) as traffic:
            time.sleep(3)
            # Hold the writer back, so that calls answered from now on are on disk in the spool only.
            blocker.execute("LOCK TABLE calls IN SHARE MODE")
            time.sleep(2)
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        blocker.rollback()
    ids = [o.call_id for o in traffic.acknowledged]
    with psycopg.connect(libpq(own_database_url)) as conn:
        stored_at_kill = conn.execute("SELECT count(*) FROM calls WHERE id = ANY(%s)", (ids,)).fetchone()[0]
    assert list(tmp_path.glob("spool.jsonl*")), "the killed proxy left its spool"

    server, port = proxy()
    with server:
        wait_until(lambda: readyz(f"http://127.0.0.1:{port}")["spool"]["pending"] == 0, timeout=30)
        settle(f"http://127.0.0.1:{port}", traffic)
        result = tally(traffic, own_database_url)
    result.show("proxy killed under load, durability=sync")
    print(f"  acknowledged but not in the database when the proxy died: {len(ids) - stored_at_kill}")

    assert len(ids) - stored_at_kill >= 10  # the case that matters did happen
    assert result.lost == 0 and result.stored == result.acknowledged
    assert result.bad_rollouts == []
    assert not list(tmp_path.glob("spool.jsonl*"))  # everything replayed, nothing left over
