"""What the benches need to run rlproxy's commands as real processes: ports, a fresh Postgres database, and a
process started in its own group and stopped with everything it started."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import requests


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, timeout: float, process: subprocess.Popen | None = None) -> None:
    """Until `url` answers below 500; a `process` that exits first, or the deadline, is an error."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the process for {url} exited with {process.returncode} (see its log)")
        try:
            if requests.get(url, timeout=2).status_code < 500:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f}s")


def fresh_database(server: str, prefix: str) -> str:
    """A new, empty database on the Postgres server at libpq URL `server`; its asyncpg URL. It is kept
    afterwards, so a run's calls and rewards can be read back."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{server.rsplit('/', 1)[0].replace('postgresql://', 'postgresql+asyncpg://', 1)}/{name}"


def rlproxy_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "rlproxy.cli", *args]


@contextlib.contextmanager
def started(command: list[str], log_path: Path, ready_url: str | None = None, timeout: float = 120.0,
            cwd: Path | None = None) -> Iterator[subprocess.Popen]:
    """`command` in a process group of its own, output to `log_path`; waits for `ready_url` if given. On exit
    SIGTERM to the whole group (the engine's vLLM processes too), SIGKILL after 30 s."""
    with open(log_path, "ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                   cwd=cwd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        if ready_url:
            wait_http(ready_url, timeout, process)
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
