"""Adapter swaps under load, shared by tests/test_adapter_swaps.py and bench/swaps.py.

Agents (the real `openai` SDK, streaming and not) call a running proxy without pause while versions are
published one after another exactly as the trainer publishes them (`trainer.publish.Publisher`: load into
the engine, then activate; old versions unloaded after draining). Every request's outcome, latency and the
policy version that served it (the proxy's `X-Rlproxy-Policy` header) are collected.
"""
from __future__ import annotations

import asyncio
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import openai

from core.settings import TrainingSettings
from store import policies
from store.db import open_database, session_factory
from trainer.ppo import PolicyTrainer
from trainer.publish import Publisher


@dataclass
class SwapReport:
    requests: int = 0
    failures: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    served_versions: dict[int, int] = field(default_factory=dict)  # version -> requests it served
    publish_to_serving: list[float] = field(default_factory=list)  # publish start -> proxy routes to it
    publish_to_first_response: list[float] = field(default_factory=list)  # ... -> first answer it gave
    load_seconds: list[float] = field(default_factory=list)
    requests_by_rollout: dict[str, int] = field(default_factory=dict)
    versions_by_rollout: dict[str, list[int]] = field(default_factory=dict)  # in call order

    def summary(self) -> str:
        slowest = max(self.latencies, default=0.0)
        to_serving = statistics.median(self.publish_to_serving) if self.publish_to_serving else float("nan")
        return (f"{self.requests} requests, {len(self.failures)} failed, slowest {slowest:.1f}s; "
                f"{len(self.publish_to_serving)} swaps, publish->serving median {to_serving:.2f}s "
                f"(max {max(self.publish_to_serving, default=0):.2f}s; first answer from the new version after "
                f"{statistics.median(self.publish_to_first_response or [float('nan')]):.2f}s), engine load median "
                f"{statistics.median(self.load_seconds) if self.load_seconds else float('nan'):.2f}s; "
                f"served by version {dict(sorted(self.served_versions.items()))}")


def make_adapter_versions(model_path: Path, target: Path, count: int) -> list[Path]:
    """`count` adapter folders as the trainer writes them (all from one fresh LoRA: serving, not learning,
    is what a swap test checks)."""
    first = PolicyTrainer(model_path, TrainingSettings()).save_adapter(target / "v1")
    paths = [first]
    for version in range(2, count + 1):
        paths.append(Path(shutil.copytree(first, target / f"v{version}")))
    return paths


async def _agent(client: openai.AsyncOpenAI, model: str, rollout: str, stop: asyncio.Event,
                 report: SwapReport, seen_at: dict[int, float], max_tokens: int) -> None:
    turn = 0
    while not stop.is_set():
        turn += 1
        messages = [{"role": "user", "content": f"Count to {turn % 7 + 2}."}]
        began = time.monotonic()
        try:
            if turn % 2:
                raw = await client.chat.completions.with_raw_response.create(
                    model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                    extra_headers={"X-Rollout-Id": rollout})
                raw.parse()
                version = int(raw.headers["X-Rlproxy-Policy"])
            else:
                async with client.chat.completions.with_streaming_response.create(
                        model=model, messages=messages, max_tokens=max_tokens, temperature=0, stream=True,
                        extra_headers={"X-Rollout-Id": rollout}) as response:
                    version = int(response.headers["X-Rlproxy-Policy"])
                    chunks = [chunk async for chunk in await response.parse()]
                    assert chunks, "empty stream"
        except Exception as exc:  # every failure is what the caller asserts on
            report.failures.append(f"{type(exc).__name__}: {exc}")
            continue
        finally:
            report.requests += 1
            report.requests_by_rollout[rollout] = report.requests_by_rollout.get(rollout, 0) + 1
            report.latencies.append(time.monotonic() - began)
        report.served_versions[version] = report.served_versions.get(version, 0) + 1
        report.versions_by_rollout.setdefault(rollout, []).append(version)
        seen_at.setdefault(version, time.monotonic())


async def swap_under_load(proxy: str, engine: str, model: str, database_url: str, adapters: list[Path], *,
                          agents: int = 4, max_tokens: int = 8, drain_seconds: float = 8.0,
                          settle_seconds: float = 3.0, timeout: float = 120.0) -> SwapReport:
    """Publish `adapters` as versions 1..n while `agents` call the proxy; returns what they saw."""
    report = SwapReport()
    seen_at: dict[int, float] = {}
    store = open_database(database_url)
    sessions = session_factory(store)
    publisher = Publisher(sessions, [engine], drain_seconds=drain_seconds)
    stop = asyncio.Event()
    http = aiohttp.ClientSession()
    client = openai.AsyncOpenAI(base_url=f"{proxy}/v1", api_key="unused", max_retries=0, timeout=timeout)
    workers = [asyncio.create_task(_agent(client, model, f"swap-agent-{i}", stop, report, seen_at, max_tokens))
               for i in range(agents)]
    try:
        await asyncio.sleep(settle_seconds)
        for version, path in enumerate(adapters, start=1):
            async with sessions() as session, session.begin():
                await policies.add_candidate(session, version, str(path), parent_version=version - 1,
                                             base_model=model, metrics={})
            began = time.monotonic()
            published = await publisher.publish(version, str(path))
            if published.error:
                report.failures.append(f"publish v{version}: {published.error}")
                continue
            report.load_seconds.append(published.load_seconds)
            switched = await _wait_until_routed(http, proxy, version, timeout)
            report.publish_to_serving.append(switched - began)
            while version not in seen_at and time.monotonic() - began < timeout:
                await asyncio.sleep(0.02)
            if version in seen_at:
                report.publish_to_first_response.append(seen_at[version] - began)
            await asyncio.sleep(settle_seconds)
            await publisher.unload_drained()
        await asyncio.sleep(drain_seconds)
        await publisher.unload_drained()  # retire the versions before the last while agents still call
        await asyncio.sleep(settle_seconds)
    finally:
        stop.set()
        await asyncio.gather(*workers)
        await client.close()
        await http.close()
        await store.dispose()
    return report


async def _wait_until_routed(http: aiohttp.ClientSession, proxy: str, version: int, timeout: float) -> float:
    """When the proxy starts routing new requests to `version` (its router's view, from `GET /policies`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        async with http.get(f"{proxy}/policies") as response:
            if (await response.json())["active"] == version:
                return time.monotonic()
        await asyncio.sleep(0.02)
    raise TimeoutError(f"the proxy never routed to v{version}")
