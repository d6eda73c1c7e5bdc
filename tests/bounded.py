"""What the bounded-ingest tests share (tests/otlp/test_bounded_otlp.py, tests/test_bounded_ingest.py): a real `rlproxy
serve` (keys on) in front of the stand-in engine, real Postgres; project alpha hits a bound while project beta,
another tenant of the same proxy, keeps making small chat calls, whose latency is measured."""
from __future__ import annotations

import asyncio
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import requests

from store.calls import write_calls
from store.db import open_database, session_factory
from store.models import utcnow
from store.records import CallRecord, ChoiceRecord
from tests.support import free_port, fresh_database, make_key, proxy_command, running

ADMIN_KEY = "bounded-ingest-admin-" + uuid.uuid4().hex
MAX_EVENTS = 8
MAX_REWARDS_PER_CALL = 3
VICTIM_P50_MS = 200


@dataclass
class Proxy:
    url: str
    alpha: str  # the tenant hitting the bounds
    beta: str  # the tenant that must not notice
    database_url: str
    pid: int

    def headers(self, key: str, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}", **extra}

    def rollout(self, key: str | None = None) -> str:
        created = requests.post(f"{self.url}/rollouts", json={}, headers=self.headers(key or self.alpha), timeout=30)
        assert created.status_code == 201, created.text
        return created.json()["rollout_id"]

    def chat(self, key: str, rollout_id: str | None = None) -> requests.Response:
        base = f"{self.url}/rollouts/{rollout_id}" if rollout_id else self.url
        return requests.post(f"{base}/v1/chat/completions", headers=self.headers(key), timeout=60,
                             json={"model": "stub-model", "messages": [{"role": "user", "content": "hi"}]})

    def read(self, rollout_id: str, **query: int) -> requests.Response:
        return requests.get(f"{self.url}/rollouts/{rollout_id}", params=query, headers=self.headers(self.alpha),
                            timeout=120)


@contextmanager
def bounded_proxy(stub_url: str, postgres_server: str, run_dir: Path) -> Iterator[Proxy]:
    """`rlproxy serve` with keys of alpha and beta, small event and per-call reward budgets, the other bounds at
    their defaults."""
    with fresh_database(postgres_server) as database_url:
        alpha, beta = make_key(database_url, "alpha"), make_key(database_url, "beta")
        port = free_port()
        args = proxy_command(port, [stub_url], database_url, "--spool-path", str(run_dir / "bounded-spool.jsonl"),
                             "--max-rollout-events", str(MAX_EVENTS),
                             "--max-rewards-per-call", str(MAX_REWARDS_PER_CALL))
        url = f"http://127.0.0.1:{port}"
        with running(args, url + "/healthz", env={"RLPROXY_ADMIN_KEY": ADMIN_KEY},
                     log_path=run_dir / "proxy-bounded.log") as process:
            yield Proxy(url, alpha, beta, database_url, process.pid)


@contextmanager
def victim(proxy: Proxy) -> Iterator[list[float]]:
    """Beta's chat calls, one after another, for as long as the block runs; yields their latencies (ms)."""
    latencies: list[float] = []
    done = threading.Event()

    def measure() -> None:
        while not done.is_set():
            started = time.perf_counter()
            assert proxy.chat(proxy.beta).status_code == 200
            latencies.append((time.perf_counter() - started) * 1000)

    thread = threading.Thread(target=measure, name="victim")
    thread.start()
    try:
        yield latencies
    finally:
        done.set()
        thread.join(120)


def under_attack(proxy: Proxy, attack: Callable[[], requests.Response], seconds: float = 4.0,
                 attackers: int = 2) -> tuple[list[int], list[float]]:
    """`attack` sent over and over by `attackers` threads for `seconds` while beta calls; (statuses, beta's
    latencies)."""
    statuses: list[int] = []
    deadline = time.monotonic() + seconds

    def attacker() -> None:
        while time.monotonic() < deadline:
            statuses.append(attack().status_code)

    with victim(proxy) as latencies:
        threads = [threading.Thread(target=attacker, name=f"attacker-{n}") for n in range(attackers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
    assert statuses and latencies
    return statuses, latencies


def assert_victim_unharmed(latencies: list[float]) -> None:
    print(f"beta: {len(latencies)} calls, p50 {statistics.median(latencies):.1f} ms, max {max(latencies):.0f} ms")
    assert statistics.median(latencies) < VICTIM_P50_MS, f"beta's p50 {statistics.median(latencies):.0f} ms"


def error(response: requests.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()["error"]
    assert body["code"] == code, body
    return body["message"]


def add_calls(database_url: str, rollout_id: str, count: int, response_bytes: int,
              tool_calls: dict[int, str] | None = None) -> list[str]:
    """`count` recorded calls of the rollout, written as the proxy's writer writes them (a rollout of thousands
    of calls through the proxy would take the test minutes); `tool_calls`: the tool call id a call's answer
    asked for, by the call's index."""
    def message(number: int) -> dict:
        if tool_calls and number in tool_calls:
            return {"role": "assistant", "tool_calls": [{"id": tool_calls[number], "type": "function",
                                                         "function": {"name": "calculate", "arguments": "{}"}}]}
        return {"role": "assistant", "content": "y" * response_bytes}

    records = [CallRecord(id=uuid.uuid4().hex, route="chat", started_at=utcnow(), rollout_id=rollout_id,
                          agent="a", project="alpha", prompt_token_ids=[1, 2, 3],
                          response={"choices": [{"index": 0, "message": message(number)}]},
                          choices=[ChoiceRecord(0, [4, 5], [-0.5, -0.25], "stop")]) for number in range(count)]

    async def write() -> None:
        database = open_database(database_url)
        try:
            async with session_factory(database)() as session, session.begin():
                await write_calls(session, records)
        finally:
            await database.dispose()

    asyncio.run(write())
    return [record.id for record in records]
