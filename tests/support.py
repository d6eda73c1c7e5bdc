"""Helpers the tests share: free ports, starting real server processes, waiting for them, and a rollout made and read
through a running proxy's API."""
from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from pathlib import Path

import requests

# The process helpers are shared with bench/ (testkit/processes.py); re-exported for the tests.
from testkit.processes import (
    PYTHON,
    ROOT,
    free_port,
    fresh_database,
    proxy_command,
    running,
    running_proxy,
    stop,
    stub_command,
    trainer_command,
    wait_http,
)

__all__ = ["PYTHON", "ROOT", "add_policies", "adapter_folder", "calls_of", "free_port", "fresh_database", "make_key",
           "new_rollout", "policy_row", "proxy_command", "pump", "running", "running_proxy", "stop", "stub_command",
           "trainer_command", "wait_http"]


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
async def transaction(database_url: str):
    """A session in one transaction on the test database, as the gates open one."""
    from store.db import short_session

    async with short_session(database_url) as sessions, sessions() as session, session.begin():
        yield session


REFUSED_MARK = "refuse-this-call"


def refuse_marked_calls(database_url: str) -> None:
    """From now on the database refuses any call whose request carries REFUSED_MARK (a check on the calls table):
    a row Postgres refuses after the agent had its answer. A NUL character was one until such text was stored as
    U+FFFD; a check stands for whatever else a real database may refuse."""
    from sqlalchemy import text

    async def add() -> None:
        async with transaction(database_url) as session:
            await session.execute(text(
                f"ALTER TABLE calls ADD CONSTRAINT refused_mark CHECK (request::text NOT LIKE '%{REFUSED_MARK}%')"))

    asyncio.run(add())


def adapter_folder(root: Path, version: int) -> str:
    """A folder the stub engine accepts as a PEFT adapter."""
    folder = root / f"v{version}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text("{}")
    (folder / "adapter_model.safetensors").write_bytes(b"\0")
    return str(folder)


async def add_policies(database_url: str, root: Path, versions: list[int], *, active: int | None = None,
                       engine_url: str | None = None, base_model: str = "stub-model",
                       policy: str = "default") -> dict[int, str]:
    """Candidate versions of `policy` (each the child of the one before), optionally one active, loaded on a
    stub engine. Returns each version's adapter name, as its row keeps it."""
    from store import policies

    names = {}
    async with transaction(database_url) as session:
        for version in versions:
            row = await policies.add_candidate(session, version, adapter_folder(root, version),
                                               parent_version=version - 1, base_model=base_model,
                                               policy=policy)
            names[version] = row.name
        if active is not None:
            await policies.activate(session, active)
    if engine_url:
        from engine.adapters import EngineAdapters

        for version in versions:
            await EngineAdapters([engine_url]).load(names[version], str(root / f"v{version}"))
    return names


async def policy_row(database_url: str, version: int):
    from store import policies

    async with transaction(database_url) as session:
        return await policies.get_policy(session, version)


async def policy_evaluation(database_url: str, version: int) -> dict | None:
    """A version's `evaluation` as `GET /policies` shows it (its verdicts, assembled)."""
    from store import policies

    async with transaction(database_url) as session:
        return await policies.evaluation_of(session, version)


def make_key(database_url: str, project: str, **options) -> str:
    """A new API key of `project` (created if new) in a test database."""
    from store.keys import create_key

    async def go() -> str:
        async with transaction(database_url) as session:
            return (await create_key(session, project, **options))[0]

    return asyncio.run(go())


def new_rollout(proxy_url: str, **body) -> tuple[str, str]:
    response = requests.post(f"{proxy_url}/rollouts", json=body)
    assert response.status_code == 201, response.text
    return response.json()["rollout_id"], response.json()["base_url"]


def calls_of(proxy_url: str, rollout_id: str) -> list[dict]:
    response = requests.get(f"{proxy_url}/rollouts/{rollout_id}")
    assert response.status_code == 200, response.text
    return response.json()["calls"]
