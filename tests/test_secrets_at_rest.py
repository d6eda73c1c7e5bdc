"""Secrets never in logs or in files other users can read: keys in a request aiohttp cannot parse, what an agent
sent in a database error, the spool, the rejected calls, SQLite files, adapters; and `/readyz` tells where the
engines are only to the operator. Against `rlproxy serve` with keys on, in front of the stand-in engine."""
from __future__ import annotations

import asyncio
import socket
import stat
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from sqlalchemy import text

from store.db import open_database
from testkit.stub_engine import BASE_MODEL, Stub
from tests.support import REFUSED_MARK, free_port, fresh_database, make_key, proxy_command, refuse_marked_calls, running
from tests.tenants import engine_in_thread

OPERATOR = "operator-" + uuid.uuid4().hex


@dataclass
class Proxy:
    url: str
    port: int
    engine_url: str
    log: Path
    spool: Path
    keys: dict[str, str]  # "agent" (project alpha), "admin" (alpha's admin key), "operator"

    def logged(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="module")
def proxy(postgres_server: str, tmp_path_factory) -> Iterator[Proxy]:
    workdir = tmp_path_factory.mktemp("secrets")
    spool = workdir / "spool-folder" / "spool.jsonl"  # its folder does not exist yet: the proxy makes it
    with engine_in_thread(Stub(BASE_MODEL)) as engine_url, fresh_database(postgres_server) as database_url:
        keys = {"agent": make_key(database_url, "alpha"), "admin": make_key(database_url, "alpha", admin=True),
                "operator": OPERATOR}
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        args = proxy_command(port, [engine_url], database_url, "--auth", "on",
                             "--spool-path", str(spool))
        with running(args, url + "/healthz", env={"RLPROXY_ADMIN_KEY": OPERATOR}, log_path=workdir / "proxy.log"):
            refuse_marked_calls(database_url)
            yield Proxy(url, port, engine_url, workdir / "proxy.log", spool, keys)


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("head", [
    b"POST /v1/chat/completions HTTP/1.1\nHost: proxy\nAuthorization: Bearer KEY\nx-api-key: KEY\n",  # bare LF
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer\r\n KEY\r\n",  # folded
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nx-api-key: KEY" + b"0" * 9000 + b"\r\n",  # too long
], ids=["bare-lf", "folded-header", "over-long-header"])
def test_a_request_aiohttp_cannot_parse_is_logged_without_its_keys(proxy: Proxy, head: bytes):
    key = proxy.keys["agent"]
    errors = proxy.logged().count("Error handling request")
    with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
        sock.sendall(head.replace(b"KEY", key.encode()) + b"Content-Length: 2\r\n\r\n{}")
        sock.settimeout(10)
        assert b" 400 " in sock.recv(4096)
    wait_for(lambda: proxy.logged().count("Error handling request") > errors)
    logged = proxy.logged()
    assert "[redacted]" in logged and key not in logged


def refused_call(proxy: Proxy, secret: str) -> str:
    """A chat call Postgres refuses to store (it breaks the check above): its answer is given, its record refused."""
    answer = requests.post(f"{proxy.url}/v1/chat/completions", timeout=30, headers={
        "Authorization": f"Bearer {proxy.keys['agent']}"}, json={
        "model": BASE_MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": f"{secret} {REFUSED_MARK}"}]})
    assert answer.status_code == 200
    return answer.headers["X-Rlproxy-Call-Id"]


def test_a_database_error_is_logged_without_the_statements_parameters(proxy: Proxy):
    secret = "what-the-agent-said-" + uuid.uuid4().hex
    call_id = refused_call(proxy, secret)
    wait_for(lambda: f"call {call_id} cannot be stored" in proxy.logged())
    logged = proxy.logged()
    assert "parameters hidden" in logged
    assert secret not in logged


def test_the_spool_and_the_rejected_calls_are_the_owners_only(proxy: Proxy):
    refused_call(proxy, "x")  # one call set aside: the rejected file exists
    rejected = proxy.spool.with_suffix(".rejected.jsonl")
    wait_for(rejected.exists)
    assert mode(proxy.spool.parent) == 0o700
    files = sorted(proxy.spool.parent.iterdir())
    assert proxy.spool in files and rejected in files
    assert {path.name: mode(path) for path in files} == {path.name: 0o600 for path in files}


def test_sqlite_database_files_are_the_owners_only(tmp_path: Path):
    url = f"sqlite+aiosqlite:///{tmp_path / 'rlproxy.db'}"

    async def modes() -> dict[str, int]:
        database = open_database(url)
        try:
            async with database.begin() as connection:
                await connection.execute(text("CREATE TABLE t (x TEXT)"))
                await connection.execute(text("INSERT INTO t VALUES ('a')"))
                return {path.name: mode(path) for path in tmp_path.iterdir()}  # open: the -wal and -shm too
        finally:
            await database.dispose()

    assert asyncio.run(modes()) == {"rlproxy.db": 0o600, "rlproxy.db-shm": 0o600, "rlproxy.db-wal": 0o600}


def test_a_saved_adapter_is_the_owners_only(tmp_path: Path):
    torch = pytest.importorskip("torch")
    from trainer.adapter import save_adapter_atomically

    class LoraConfig:  # what save_adapter_atomically reads of a peft model
        def to_dict(self) -> dict:
            return {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "peft_type": "LORA"}

    class Model:
        peft_config = {"default": LoraConfig()}

    target = save_adapter_atomically(Model(), {"state": {}}, tmp_path / "adapters" / "v1",
                                     weights={"base_model.model.lora_A.weight": torch.zeros(2, 2)})
    assert mode(target.parent) == 0o700 and mode(target) == 0o700
    assert {path.name: mode(path) for path in target.iterdir()} == {
        "adapter_config.json": 0o600, "adapter_model.safetensors": 0o600, "optimizer.pt": 0o600,
        "trainer_state.json": 0o600}


@pytest.mark.parametrize(("who", "details"), [(None, False), ("agent", False), ("not-a-key", False),
                                              ("admin", False), ("operator", True)])
def test_readyz_tells_where_the_engines_are_only_to_the_operator(proxy: Proxy, who: str | None, details: bool):
    key = proxy.keys.get(who, who)
    answer = requests.get(f"{proxy.url}/readyz", timeout=10,
                          headers={"Authorization": f"Bearer {key}"} if key else {})
    assert answer.status_code == 200
    if details:
        assert answer.json()["engines"] == {proxy.engine_url: True}
        assert answer.json()["spool"]["path"] == str(proxy.spool)
    else:
        assert answer.json() == {"status": "ready"}
        assert proxy.engine_url not in answer.text
