"""Helpers the tests share: free ports, starting real server processes, waiting for them."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import psycopg
import requests

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, timeout: float = 30.0, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {process.returncode}")
        try:
            if requests.get(url, timeout=1).status_code < 500:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout}s")


@contextmanager
def running(args: list[str], ready_url: str, *, env: dict[str, str] | None = None, timeout: float = 60.0,
            log_path: Path | None = None):
    """Run a server process until the block ends; its output goes to `log_path` (shown if it fails)."""
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL
    process = subprocess.Popen(args, cwd=ROOT, env={**os.environ, **(env or {})}, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        try:
            wait_http(ready_url, timeout, process)
        except Exception:
            if log_path:
                print(Path(log_path).read_text()[-4000:], file=sys.stderr)
            raise
        yield process
    finally:
        stop(process)
        if log_path:
            log.close()


def stop(process: subprocess.Popen, grace: float = 10.0) -> None:
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


def stub_command(port: int) -> list[str]:
    return [PYTHON, str(ROOT / "tests" / "stub_engine.py"), "--port", str(port)]


def proxy_command(port: int, upstreams: list[str], database_url: str, *extra: str) -> list[str]:
    args = [PYTHON, "-m", "rlproxy.cli", "serve", "--port", str(port), "--database-url", database_url]
    for upstream in upstreams:
        args += ["--upstream", upstream]
    return args + list(extra)


def trainer_command(database_url: str, upstream: str, model: Path, adapters: Path, *extra: str,
                    metrics_port: int = 0, settings: dict[str, object] | None = None) -> list[str]:
    """`rlproxy train` against one engine (metrics port 0: any free one); `settings` are TrainConfig fields
    (`--set name=value`)."""
    args = [PYTHON, "-m", "rlproxy.cli", "train", "--database-url", database_url, "--upstream", upstream,
            "--model", str(model), "--adapters-dir", str(adapters), "--metrics-port", str(metrics_port)]
    for name, value in (settings or {}).items():
        args += ["--set", f"{name}={value}"]
    return args + list(extra)


@contextmanager
def running_proxy(upstreams: list[str], database_url: str, workdir: Path, name: str = "proxy", *extra: str):
    """`rlproxy serve` as a real process on a free port, its spool and log in `workdir`; yields its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = proxy_command(port, upstreams, database_url, "--spool-path", str(workdir / f"{name}-spool.jsonl"),
                         *extra)
    with running(args, url + "/healthz", log_path=workdir / f"{name}.log"):
        yield url


@contextmanager
def fresh_database(server: str, prefix: str = "rlproxy_test"):
    """A new, migrated database on the Postgres server at libpq URL `server`, dropped afterwards; yields its
    asyncpg URL."""
    from store.migrate import upgrade

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = server.rsplit("/", 1)[0]
    url = f"{base.replace('postgresql://', 'postgresql+asyncpg://', 1)}/{name}"
    try:
        upgrade(url)
        yield url
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def pump(src, dst, observe=None) -> None:
    """Copy one direction of a relayed TCP connection until it ends, then abort the other side."""
    try:
        while data := await src.read(65536):
            if observe is not None:
                observe(data)
            dst.write(data)
            await dst.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        dst.transport.abort()


# --- policies in a test database ---------------------------------------------------------------------------


@asynccontextmanager
async def _transaction(database_url: str):
    from store.db import create_engine, session_factory

    engine = create_engine(database_url, pool_size=1)
    try:
        async with session_factory(engine)() as session, session.begin():
            yield session
    finally:
        await engine.dispose()


def adapter_folder(root: Path, version: int) -> str:
    """A folder the stub engine accepts as a PEFT adapter."""
    folder = root / f"v{version}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text("{}")
    (folder / "adapter_model.safetensors").write_bytes(b"\0")
    return str(folder)


async def add_policies(database_url: str, root: Path, versions: list[int], *, active: int | None = None,
                       engine_url: str | None = None, base_model: str = "stub-model") -> None:
    """Candidate versions (each the child of the one before), optionally one active, loaded on a stub engine."""
    from store import policies

    async with _transaction(database_url) as session:
        for version in versions:
            await policies.add_candidate(session, version, adapter_folder(root, version), parent_version=version - 1,
                                         base_model=base_model)
        if active is not None:
            await policies.activate(session, active)
    if engine_url:
        for version in versions:
            loaded = requests.post(f"{engine_url}/v1/load_lora_adapter", json={
                "lora_name": policies.adapter_name(version), "lora_path": str(root / f"v{version}")})
            assert loaded.status_code == 200 or "already" in loaded.text


async def policy_row(database_url: str, version: int):
    from store import policies

    async with _transaction(database_url) as session:
        return await policies.get_policy(session, version)
