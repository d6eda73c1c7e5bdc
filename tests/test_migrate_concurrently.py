"""Several processes migrating one new database at once (proxies and a trainer starting together, each of which
migrates first) all end at the newest schema: one migrates, the others wait and find nothing left to do."""
from __future__ import annotations

import subprocess
import sys

import psycopg

from testkit.processes import create_database, drop_database


def test_four_processes_migrating_one_new_database_at_once_all_succeed(postgres_server):
    url = create_database(postgres_server, "rlproxy_test", migrate=False)
    try:
        starts = [subprocess.Popen([sys.executable, "-m", "rlproxy.cli", "migrate", "--database-url", url],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(4)]
        outcomes = [(process.wait(180), process.stdout.read()) for process in starts]
        assert [code for code, _ in outcomes] == [0] * 4, outcomes
        with psycopg.connect(url.replace("postgresql+asyncpg://", "postgresql://", 1)) as conn:
            assert conn.execute("SELECT count(*) FROM alembic_version").fetchone()[0] == 1
            assert conn.execute("SELECT to_regclass('rollouts')").fetchone()[0] == "rollouts"
    finally:
        drop_database(postgres_server, url)
