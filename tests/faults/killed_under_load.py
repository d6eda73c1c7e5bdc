"""Agents calling a proxy as fast as it answers, through a SIGKILL of the proxy and its restart: `calls` chat
calls (every third streamed) from `concurrency` agents, each its own rollout; the proxy is killed once half of
them were answered and started again on the same spool and database, and the agents go on until every call
was answered. Which calls were acknowledged (the whole answer arrived) is known by their `X-Rlproxy-Call-Id`."""
from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psycopg

from tests.faults.traffic import libpq
from tests.support import free_port, proxy_command, running

BODY = {"model": "stub-model", "max_tokens": 4, "messages": [{"role": "user", "content": "What is 6 times 7?"}]}


@dataclass
class Run:
    acknowledged: dict[str, list[str]] = field(default_factory=dict)  # rollout id -> call ids, in answer order
    failed: int = 0  # calls that got no whole answer (the proxy was killed, or not up yet)
    stored_at_kill: int = 0  # of the calls acknowledged before the kill, how many the database had then
    acknowledged_at_kill: int = 0

    @property
    def ids(self) -> list[str]:
        return [call for calls in self.acknowledged.values() for call in calls]


class Proxy:
    """`rlproxy serve` on the stub, a new port each start, the same spool and database."""

    def __init__(self, stub_url: str, database_url: str, workdir: Path, *flags: str) -> None:
        self.stub_url, self.database_url, self.workdir, self.flags = stub_url, database_url, workdir, flags
        self.url = ""
        self.starts = 0

    def start(self, stack: ExitStack):
        port = free_port()
        self.starts += 1
        args = proxy_command(port, [self.stub_url], self.database_url, "--no-migrate", "--spool-path",
                             str(self.workdir / "spool.jsonl"), *self.flags)
        process = stack.enter_context(running(args, f"http://127.0.0.1:{port}/healthz",
                                              log_path=self.workdir / f"proxy-{self.starts}.log"))
        self.url = f"http://127.0.0.1:{port}"
        return process


async def load(proxy: Proxy, run: Run, calls: int, concurrency: int, at_half: Callable[[], None]) -> None:
    """Send until `calls` calls were acknowledged; `at_half` runs (blocking every agent) once half were."""
    sent = 0
    halfway = False

    async def agent(session: aiohttp.ClientSession) -> None:
        nonlocal sent, halfway
        rollout = uuid.uuid4().hex
        answered = run.acknowledged.setdefault(rollout, [])
        n = 0
        while sent < calls:
            sent += 1
            n += 1
            call_id = await one(session, f"{proxy.url}/rollouts/{rollout}/v1/chat/completions", n % 3 == 0)
            if call_id is None:
                run.failed += 1
                sent -= 1  # not answered: the agent tries again
                await asyncio.sleep(0.05)
                continue
            answered.append(call_id)
            if not halfway and len(run.ids) >= calls // 2:
                halfway = True
                at_half()

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
        await asyncio.gather(*(agent(session) for _ in range(concurrency)))


async def one(session: aiohttp.ClientSession, url: str, stream: bool) -> str | None:
    """One call; its id once the whole answer has arrived, else None."""
    try:
        async with session.post(url, json={**BODY, "stream": stream}) as response:
            body = await response.read()
            if response.status != 200:
                return None
            if stream and not body.rstrip().endswith(b"data: [DONE]"):
                return None
            return response.headers["X-Rlproxy-Call-Id"]
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return None


def kill_under_load(stub_url: str, database_url: str, workdir: Path, *flags: str, calls: int = 2000,
                    concurrency: int = 16) -> Run:
    """The run; when it returns, the second proxy has stored every acknowledged call it could (30 s at most)."""
    proxy = Proxy(stub_url, database_url, workdir, *flags)
    run = Run()
    with ExitStack() as stack:
        first = proxy.start(stack)

        def kill_and_restart() -> None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
            run.acknowledged_at_kill = len(run.ids)
            run.stored_at_kill = len(stored(database_url, run.ids))
            proxy.start(stack)  # the agents' next calls go to the new one

        asyncio.run(load(proxy, run, calls, concurrency, kill_and_restart))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(stored(database_url, run.ids)) < len(run.ids):
            time.sleep(0.2)
    return run


def stored(database_url: str, ids: list[str]) -> set[str]:
    """The ids among `ids` that are in the database."""
    if not ids:
        return set()
    if database_url.startswith("sqlite"):
        marks = ",".join("?" * len(ids))
        return {row[0] for row in query(database_url, f"SELECT id FROM calls WHERE id IN ({marks})", *ids)}
    return {row[0] for row in query(database_url, "SELECT id FROM calls WHERE id = ANY(%s)", ids)}


def numbering(database_url: str, rollout_id: str) -> tuple[list[tuple[str, int]], int | None]:
    """A rollout's calls as (id, seq) in seq order, and the rollout's call count."""
    mark = "?" if database_url.startswith("sqlite") else "%s"
    calls = query(database_url, f"SELECT id, seq FROM calls WHERE rollout_id = {mark} ORDER BY seq", rollout_id)
    count = query(database_url, f"SELECT call_count FROM rollouts WHERE id = {mark}", rollout_id)
    return [tuple(row) for row in calls], count[0][0] if count else None


def query(database_url: str, sql: str, *params) -> list[tuple]:
    if database_url.startswith("sqlite"):
        conn = sqlite3.connect(database_url.split("///", 1)[1], timeout=30)
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()
    with psycopg.connect(libpq(database_url)) as conn:
        return conn.execute(sql, params).fetchall()
