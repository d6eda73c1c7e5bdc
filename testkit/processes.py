"""rlproxy's commands (and the stand-in engine) as real processes, for tests and benchmarks.

    with running(proxy_command(port, [engine_url], database_url), f"http://127.0.0.1:{port}/healthz",
                 log_path=tmp / "proxy.log"):
        ...                                   # the proxy answers; afterwards its whole process group is stopped

Every process runs in a session (process group) of its own, so stopping it stops what it started too (the
engine's vLLM processes). The working directory is the repository root.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from contextlib import contextmanager
from pathlib import Path

import psycopg

from migrations.apply import upgrade
from testkit.stub_engine import STUB_CONTROLS

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def answers(url: str, timeout: float = 1.0) -> bool:
    """Whether `url` answers with a status below 500."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status < 500
    except urllib.error.HTTPError as error:
        return error.code < 500
    except (OSError, ValueError):
        return False


def wait_http(url: str, timeout: float = 30.0, process: subprocess.Popen | None = None) -> None:
    """Until `url` answers below 500; a `process` that exits first, or the deadline, is an error."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {process.returncode}")
        if answers(url):
            return
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout}s")


@contextmanager
def running(args: list[str], ready_url: str | None, *, env: dict[str, str] | None = None, timeout: float = 60.0,
            log_path: Path | None = None, cwd: Path = ROOT):
    """Run a server process until the block ends, once `ready_url` answers (None: at once); its output goes to
    `log_path` (whose end is shown if it does not get ready)."""
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL
    process = subprocess.Popen(args, cwd=cwd, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        try:
            if ready_url is not None:
                wait_http(ready_url, timeout, process)
        except Exception:
            if log_path:
                print(Path(log_path).read_text(errors="replace")[-4000:], file=sys.stderr)
            raise
        yield process
    finally:
        stop(process)
        if log_path:
            log.close()


def stop(process: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM to the process's group, SIGKILL after `grace` seconds."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def rlproxy_command(*args: str) -> list[str]:
    return [PYTHON, "-m", "rlproxy.cli", *args]


def stub_command(port: int) -> list[str]:
    """The stand-in engine (testkit/stub_engine.py) on `port`."""
    return [PYTHON, "-m", "testkit.stub_engine", "--port", str(port)]


def proxy_command(port: int, upstreams: list[str], database_url: str, *extra: str,
                  stub_controls: bool = True) -> list[str]:
    """`rlproxy serve` in front of `upstreams`, taking the stand-in engine's controls as request fields unless
    told not to (a real engine ignores them)."""
    args = rlproxy_command("serve", "--port", str(port), "--database-url", database_url)
    for upstream in upstreams:
        args += ["--upstream", upstream]
    for control in STUB_CONTROLS if stub_controls else ():
        args += ["--allow-request-field", control]
    return args + list(extra)


def trainer_command(database_url: str, upstream: str, model: Path, adapters: Path, *extra: str,
                    metrics_port: int = 0, settings: dict[str, object] | None = None) -> list[str]:
    """`rlproxy train` against one engine (metrics port 0: any free one); `settings` are training settings
    (`--set name=value`)."""
    args = rlproxy_command("train", "--database-url", database_url, "--upstream", upstream, "--model", str(model),
                           "--adapters-dir", str(adapters), "--metrics-port", str(metrics_port))
    for name, value in (settings or {}).items():
        args += ["--set", f"{name}={value}"]
    return args + list(extra)


def create_database(server: str, prefix: str, *, migrate: bool = True) -> str:
    """A new database on the Postgres server at libpq URL `server` (migrated unless told); its asyncpg URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"{server.rsplit('/', 1)[0].replace('postgresql://', 'postgresql+asyncpg://', 1)}/{name}"
    if migrate:
        upgrade(url)
    return url


def drop_database(server: str, url: str) -> None:
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')


@contextmanager
def fresh_database(server: str, prefix: str = "rlproxy_test"):
    """A new, migrated database on the Postgres server at libpq URL `server`, dropped afterwards; yields its
    asyncpg URL."""
    url = create_database(server, prefix)
    try:
        yield url
    finally:
        drop_database(server, url)


@contextmanager
def running_proxy(upstreams: list[str], database_url: str, workdir: Path, name: str = "proxy", *extra: str,
                  stub_controls: bool = True, env: dict[str, str] | None = None):
    """`rlproxy serve` as a real process on a free port, its spool and log in `workdir`; yields its URL.
    `stub_controls`: it takes the stand-in engine's controls as request fields (testkit/processes.py); `env`: more
    variables, the secrets among them (`RLPROXY_ADMIN_KEY`: no secret is taken on the command line)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = proxy_command(port, upstreams, database_url, "--spool-path", str(workdir / f"{name}-spool.jsonl"),
                         *extra, stub_controls=stub_controls)
    with running(args, url + "/healthz", env=env, log_path=workdir / f"{name}.log"):
        yield url
