"""Scale-out: two proxies share one Postgres database and the same two engine replicas (the real vLLM engine
and a stub serving the same model name). Agents call both proxies for the same rollouts at once; every call
is recorded once with gapless sequence numbers, a rollout stays on one replica, a replica that goes away is
failed over and taken back when it returns, and a published adapter reaches both engines before both
proxies serve it — or, when one engine refuses it, never serves at all. (The last test: a replica that
restarts while an adapter is active.)"""
from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from collections import defaultdict
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import openai
import pytest
import requests
from sqlalchemy import select

from engine.model import prepare_model
from store import policies
from store.db import open_database, session_factory
from store.models import Call, Rollout
from testkit.swap_load import make_adapter_versions
from tests.support import free_port, running, running_proxy, stop, stub_command
from trainer.publish import Publisher

ROLLOUTS = 24
ROUNDS = 2  # each round a rollout calls both proxies at once
MAX_TOKENS = 4  # the real engine makes ~10 tokens/s on two cores


@dataclass(slots=True)
class Sent:
    proxy: int
    rollout: str
    call_id: str
    policy: int
    began: float
    ended: float


class Agents:
    """The real `openai` SDK against both proxies; what each call's response headers said is kept."""

    def __init__(self, proxies: list[str], model: str) -> None:
        self.clients = [openai.AsyncOpenAI(base_url=f"{p}/v1", api_key="unused", max_retries=0, timeout=120)
                        for p in proxies]
        self.model = model
        self.sent: list[Sent] = []
        self.failures: list[str] = []

    async def call(self, proxy: int, rollout: str, turn: int, *, stream: bool) -> Sent | None:
        client = self.clients[proxy]
        began = time.monotonic()
        args = dict(model=self.model, messages=[{"role": "user", "content": f"Say a number above {turn}."}],
                    max_tokens=MAX_TOKENS, temperature=0, extra_headers={"X-Rollout-Id": rollout})
        try:
            if stream:
                async with client.chat.completions.with_streaming_response.create(**args, stream=True) as raw:
                    assert [chunk async for chunk in await raw.parse()], "empty stream"
            else:
                raw = await client.chat.completions.with_raw_response.create(**args)
                assert raw.parse().choices[0].message.content is not None
        except Exception as exc:  # every failure is asserted on by the caller
            self.failures.append(f"proxy {proxy}, rollout {rollout}: {type(exc).__name__}: {exc}")
            return None
        sent = Sent(proxy, rollout, raw.headers["X-Rlproxy-Call-Id"], int(raw.headers["X-Rlproxy-Policy"]),
                    began, time.monotonic())
        self.sent.append(sent)
        return sent

    async def round(self, rollouts: list[str], turn: int) -> list[Sent]:
        """Every rollout calls both proxies at the same moment (one streams), so both write it at once."""
        calls = [self.call(p, r, turn, stream=(p + turn) % 2 == 1) for r in rollouts for p in (0, 1)]
        return [s for s in await asyncio.gather(*calls) if s is not None]

    async def close(self) -> None:
        for client in self.clients:
            await client.close()


async def recorded(sessions, sent: list[Sent], timeout: float = 15.0) -> dict[str, Call]:
    """The stored rows of these calls, once the proxies' writers have stored them all."""
    ids = [s.call_id for s in sent]
    deadline = time.monotonic() + timeout
    while True:
        async with sessions() as session:
            rows = {c.id: c for c in (await session.execute(select(Call).where(Call.id.in_(ids)))).scalars()}
        if len(rows) == len(ids) or time.monotonic() > deadline:
            return rows
        await asyncio.sleep(0.1)


async def active_on(http: aiohttp.ClientSession, proxy: str) -> tuple[int, dict[int, str]]:
    async with http.get(f"{proxy}/policies") as response:
        body = await response.json()
    return body["active"], {p["version"]: p["status"] for p in body["data"]}


def refused_by_stub(adapter: Path, target: Path) -> Path:
    """The same adapter with its weights as `adapter_model.bin`: vLLM loads that, the stub does not."""
    import torch
    from safetensors.torch import load_file

    target.mkdir(parents=True)
    shutil.copy(adapter / "adapter_config.json", target)
    torch.save(load_file(adapter / "adapter_model.safetensors"), target / "adapter_model.bin")
    return target


@pytest.mark.engine
def test_two_proxies_share_rollouts_replicas_and_policies(engine_url, engine_model, own_database_url,
                                                           tmp_path):
    pytest.importorskip("torch")
    began = time.monotonic()
    stub_port = free_port()
    stub_url = f"http://127.0.0.1:{stub_port}"

    def start_stub(stack: ExitStack, name: str):
        return stack.enter_context(running(stub_command(stub_port) + ["--model", engine_model],
                                           stub_url + "/health", log_path=tmp_path / f"{name}.log"))

    with ExitStack() as stack:
        stub = start_stub(stack, "stub")
        upstreams = [engine_url, stub_url]
        proxies = [stack.enter_context(running_proxy(upstreams, own_database_url, tmp_path, f"proxy-{n}",
                                                     "--served-model", engine_model)) for n in "ab"]
        report = asyncio.run(scenario(proxies, engine_url, engine_model, stub_url, own_database_url, tmp_path,
                                      stop_stub=lambda: stop(stub),
                                      restart_stub=lambda: start_stub(stack, "stub-restarted")))
    print(f"{report}; {time.monotonic() - began:.1f}s in all")


async def scenario(proxies, engine_url, model, stub_url, database_url, tmp_path, *, stop_stub,
                   restart_stub) -> str:
    store = open_database(database_url)
    sessions = session_factory(store)
    agents = Agents(proxies, model)
    http = aiohttp.ClientSession()
    # Building the adapter takes a while on CPU: it runs while the traffic phases do.
    adapter = asyncio.create_task(
        asyncio.to_thread(make_adapter_versions, prepare_model(), tmp_path / "adapters", 1))
    phases = []
    mark = time.monotonic()

    def phase(name: str) -> None:
        nonlocal mark
        phases.append(f"{name} {time.monotonic() - mark:.1f}s")
        mark = time.monotonic()

    try:
        rollouts = [uuid.uuid4().hex for _ in range(ROLLOUTS)]
        replica_of = await shared_rollouts(agents, sessions, rollouts, engine_url, stub_url)
        phase("shared rollouts")
        outage = await failover_and_return(agents, sessions, rollouts, replica_of, engine_url, stub_url,
                                           stop_stub, restart_stub)
        phase("failover")
        [adapter_path] = await adapter
        phase("adapter wait")
        switch = await publish_to_both(agents, sessions, http, proxies, replica_of, engine_url, stub_url,
                                       model, adapter_path, tmp_path)
        phase("publish")
        return f"{len(agents.sent)} calls; {outage}; {switch}; {', '.join(phases)}"
    finally:
        adapter.cancel()
        await agents.close()
        await http.close()
        await store.dispose()


async def shared_rollouts(agents: Agents, sessions, rollouts, engine_url, stub_url) -> dict[str, str]:
    """Both proxies write the same rollouts at the same time: each call is stored once, sequence numbers are
    1..n without gaps, and all of a rollout's calls went to one replica (both replicas got rollouts)."""
    began = time.monotonic()
    sent = []
    for turn in range(ROUNDS):
        sent += await agents.round(rollouts, turn)
    assert agents.failures == []
    assert len(sent) == ROLLOUTS * ROUNDS * 2 and {s.policy for s in sent} == {0}
    rows = await recorded(sessions, sent)
    assert len(rows) == len(sent)

    async with sessions() as session:
        stored = (await session.execute(select(Call.rollout_id, Call.seq, Call.upstream)
                                        .where(Call.rollout_id.in_(rollouts)))).all()
        counts = dict((await session.execute(select(Rollout.id, Rollout.call_count)
                                             .where(Rollout.id.in_(rollouts)))).all())
    seqs, replicas = defaultdict(list), defaultdict(set)
    for rollout, seq, upstream in stored:
        seqs[rollout].append(seq)
        replicas[rollout].add(upstream)
    for rollout in rollouts:
        assert sorted(seqs[rollout]) == list(range(1, 2 * ROUNDS + 1)), rollout  # once each, no gaps
        assert counts[rollout] == 2 * ROUNDS
        assert len(replicas[rollout]) == 1, f"rollout {rollout} moved between replicas: {replicas[rollout]}"
    replica_of = {rollout: replicas[rollout].pop() for rollout in rollouts}
    assert set(replica_of.values()) == {engine_url, stub_url}  # rendezvous hashing spread the rollouts
    print(f"{len(sent)} calls in {time.monotonic() - began:.1f}s; "
          f"{sum(r == stub_url for r in replica_of.values())} of {ROLLOUTS} rollouts on the stub")
    return replica_of


async def failover_and_return(agents: Agents, sessions, rollouts, replica_of, engine_url, stub_url,
                              stop_stub, restart_stub) -> str:
    """Stop the stub while agents keep calling: nothing fails, its rollouts go to the real engine; a new stub
    on the same port gets its rollouts back from both proxies, which keep running."""
    on_stub = [r for r in rollouts if replica_of[r] == stub_url]
    halt = asyncio.Event()
    turns = iter(range(ROUNDS, 10_000))

    async def agent(index: int, rollout: str) -> None:
        proxy = index % 2
        while not halt.is_set():
            await agents.call(proxy, rollout, next(turns), stream=proxy == 1)
            proxy = 1 - proxy
            await asyncio.sleep(0.1)  # an agent's own work between calls

    def from_stub_rollouts(since: float, until: float = float("inf")) -> list[Sent]:
        return [s for s in agents.sent if s.rollout in on_stub and s.began > since and s.ended < until]

    async def until(condition, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not await condition():
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.2)

    async def each_proxy_served(calls_since: float, replica: str) -> bool:
        calls = from_stub_rollouts(calls_since)
        rows = await recorded(sessions, calls, timeout=0)
        served = {s.proxy for s in calls if rows.get(s.call_id) and rows[s.call_id].upstream == replica}
        return served == {0, 1}

    workers = [asyncio.create_task(agent(i, r)) for i, r in enumerate(on_stub)]
    try:
        await asyncio.sleep(1.0)
        await asyncio.to_thread(stop_stub)
        stopped = time.monotonic()
        await until(lambda: each_proxy_served(stopped, engine_url), 30, "no failover to the real engine")
        await asyncio.to_thread(restart_stub)
        restarted = time.monotonic()
        await until(lambda: each_proxy_served(restarted, stub_url), 30,
                    "the restarted stub got no traffic back")
        back_after = time.monotonic() - restarted
    finally:
        halt.set()
        await asyncio.gather(*workers)

    assert agents.failures == []  # the outage cost no request
    during = from_stub_rollouts(stopped, restarted)
    rows = await recorded(sessions, during)
    assert during and {rows[s.call_id].upstream for s in during} == {engine_url}
    assert all(rows[s.call_id].status == "ok" for s in during)
    return (f"failover: {len(during)} calls of the stub's rollouts served by the real engine, "
            f"both proxies back on the restarted stub after {back_after:.1f}s")


async def publish_to_both(agents: Agents, sessions, http, proxies, replica_of, engine_url, stub_url, model,
                          adapter: Path, tmp_path: Path) -> str:
    """Load into both engines, then activate: both proxies switch within seconds and stamp the new version,
    served by both replicas. A version one of the two engines refuses is not on a majority of them: it is marked
    failed and never serves."""
    # The stub stands in for a second replica of the real engine but answers with other logprobs by design:
    # the fleet checks the adapter folder's digest only, not the probe (engine/fleet.py).
    publisher = Publisher(sessions, [engine_url, stub_url], probe=False)
    async with sessions() as session, session.begin():
        v1 = (await policies.add_candidate(session, 1, str(adapter), parent_version=0, base_model=model,
                                           metrics={})).name  # the adapter name its row keeps
    published = await publisher.publish(1, str(adapter))
    assert published.activated and published.error is None
    activated = time.monotonic()
    while {(await active_on(http, p))[0] for p in proxies} != {1}:
        assert time.monotonic() - activated < 5, "a proxy did not switch to v1 within 5 s"
        await asyncio.sleep(0.05)
    switched = time.monotonic() - activated

    # A few rollouts of each replica (the real engine is slow with an adapter on CPU).
    on = {replica: [r for r, home in replica_of.items() if home == replica]
          for replica in (engine_url, stub_url)}
    sent = await agents.round(on[engine_url][:4] + on[stub_url][:4], 100)
    assert agents.failures == []
    assert {s.policy for s in sent} == {1}
    rows = await recorded(sessions, sent)
    assert {rows[s.call_id].policy_version for s in sent} == {1}
    assert {rows[s.call_id].upstream_model for s in sent} == {v1}
    assert {rows[s.call_id].upstream for s in sent} == {engine_url, stub_url}
    assert all(rows[s.call_id].status == "ok" for s in sent)

    refused = refused_by_stub(adapter, tmp_path / "adapters" / "v2")
    async with sessions() as session, session.begin():
        v2 = (await policies.add_candidate(session, 2, str(refused), parent_version=1, base_model=model,
                                           metrics={})).name
    failed = await publisher.publish(2, str(refused))
    assert not failed.activated and "refused" in failed.error
    await asyncio.sleep(1.5)  # past a policy refresh of every proxy
    for proxy in proxies:
        active, statuses = await active_on(http, proxy)
        assert active == 1 and statuses[1] == "active" and statuses[2] == "failed"
    after = await agents.round(on[engine_url][:2] + on[stub_url][:2], 101)
    assert agents.failures == [] and {s.policy for s in after} == {1}
    rows = await recorded(sessions, after)
    assert {(rows[s.call_id].policy_version, rows[s.call_id].upstream_model) for s in after} == {(1, v1)}
    async with http.get(f"{engine_url}/v1/models") as response:
        loaded = {m["id"] for m in (await response.json())["data"]}
    # The engine that accepted v2 does not keep an adapter that can never serve.
    assert v1 in loaded and v2 not in loaded
    return f"publish: load {published.load_seconds:.1f}s, both proxies on v1 {switched:.2f}s after activation"


def wait_until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def adapter_folder(path: Path) -> Path:
    """An adapter folder as the stub engine takes it (it only checks that the files are there)."""
    path.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (path / name).write_text("{}")
    return path


def publish_v1(database_url: str, adapter: Path, urls: list[str]) -> None:
    """Version 1 from `adapter`, published to the replicas at `urls` and made active."""
    async def publish() -> None:
        store = open_database(database_url)
        sessions = session_factory(store)
        async with sessions() as session, session.begin():
            await policies.add_candidate(session, 1, str(adapter), parent_version=0, base_model="stub-model",
                                         metrics={})
        assert (await Publisher(sessions, urls).publish(1, str(adapter))).activated
        await store.dispose()

    asyncio.run(publish())


def test_a_restarted_replica_serves_the_active_adapter_again(own_database_url, tmp_path):
    adapter = adapter_folder(tmp_path / "v1")
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{port}" for port in ports]

    with ExitStack() as stack:
        first = stack.enter_context(running(stub_command(ports[0]), urls[0] + "/health"))
        stack.enter_context(running(stub_command(ports[1]), urls[1] + "/health"))
        proxy = stack.enter_context(running_proxy(urls, own_database_url, tmp_path, "proxy",
                                                  "--served-model", "stub-model"))
        publish_v1(own_database_url, adapter, urls)
        wait_until(lambda: requests.get(f"{proxy}/policies").json()["active"] == 1)
        stop(first)
        stack.enter_context(running(stub_command(ports[0]), urls[0] + "/health"))
        client = openai.OpenAI(base_url=f"{proxy}/v1", api_key="unused", max_retries=0)
        deadline = time.monotonic() + 12  # the proxies look at their engines every 5 s
        while True:
            failed = []
            for rollout in range(16):  # ~half of them live on the restarted replica
                try:
                    raw = client.chat.completions.with_raw_response.create(
                        model="stub-model", messages=[{"role": "user", "content": "hi"}],
                        extra_headers={"X-Rollout-Id": f"rollout-{rollout}"})
                    assert raw.headers["X-Rlproxy-Policy"] == "1"
                except openai.APIStatusError as exc:
                    failed.append(exc.status_code)
            if not failed or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        client.close()
    assert failed == []


def test_a_served_adapter_replaced_from_another_folder_is_loaded_again_from_its_own(own_database_url, tmp_path):
    """Someone who reached an engine (not through the proxy) unloads the served adapter and loads other weights
    under its name: the name alone looked right. The proxy compares the folder each replica reports with the
    version's own and loads the version again from it."""
    adapter, other = adapter_folder(tmp_path / "v1"), adapter_folder(tmp_path / "elsewhere")
    port = free_port()
    url = f"http://127.0.0.1:{port}"

    def folder_served() -> str | None:
        listed = requests.get(f"{url}/v1/models", timeout=5).json()["data"]
        return next((m["root"] for m in listed if m["id"] == v1), None)

    with ExitStack() as stack:
        stack.enter_context(running(stub_command(port), url + "/health"))
        proxy = stack.enter_context(running_proxy([url], own_database_url, tmp_path, "proxy",
                                                  "--served-model", "stub-model"))
        publish_v1(own_database_url, adapter, [url])
        wait_until(lambda: requests.get(f"{proxy}/policies").json()["active"] == 1)
        # the served adapter's name, as GET /policies shows it
        [v1] = [p["name"] for p in requests.get(f"{proxy}/policies").json()["data"] if p["version"] == 1]
        assert folder_served() == str(adapter)
        assert requests.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": v1}).ok
        assert requests.post(f"{url}/v1/load_lora_adapter",
                             json={"lora_name": v1, "lora_path": str(other)}).ok
        assert folder_served() == str(other)
        wait_until(lambda: folder_served() == str(adapter))  # the proxies look at their engines every 5 s
