"""The proxy is killed (SIGKILL) under load with `--durability sync`: every call an agent received is in the
database exactly once after the proxy starts again with the same spool, including those the database had not
taken yet when it died."""
from __future__ import annotations

import os
import signal
import time

import psycopg

from tests.faults.test_database_outage import readyz, wait_until
from tests.faults.traffic import Traffic, libpq, settle, tally
from tests.support import free_port, proxy_command, running


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
