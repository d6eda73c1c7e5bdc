"""A Postgres server of the test's own (initdb + pg_ctl into a temporary folder, on a free port), so a test
may stop and start it; the machine's shared server is never touched."""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg

from tests.support import free_port


def server_binaries() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if found:
        return Path(found[-1]).parent
    pg_ctl = shutil.which("pg_ctl")
    return Path(pg_ctl).parent if pg_ctl else None


class PrivatePostgres:
    def __init__(self) -> None:
        binaries = server_binaries()
        if binaries is None:
            raise RuntimeError("PostgreSQL's server binaries (initdb, pg_ctl) are not installed")
        self.bin = binaries
        # Not under pytest's tmp_path: the server may run as the `postgres` user, who must reach the folder.
        self.root = Path(tempfile.mkdtemp(prefix="rlproxy-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.as_postgres = os.geteuid() == 0  # the server refuses to run as root
        if self.as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        os.chmod(self.root, 0o755)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")

    @property
    def url(self) -> str:
        """libpq URL of the maintenance database."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self.bin / tool), *args]
        if self.as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, cwd=self.root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-o", options, "-w",
                  "start")

    def stop(self) -> None:
        """A fast shutdown: open sessions are terminated, as when an operator stops the server."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def create_database(self, name: str) -> str:
        """Create `name`; returns its asyncpg URL."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/{name}"

    def destroy(self) -> None:
        try:
            self.stop()
        except subprocess.CalledProcessError:
            pass  # already stopped
        shutil.rmtree(self.root, ignore_errors=True)
