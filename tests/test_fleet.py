"""Adapters committed to a fleet of engine replicas (engine/fleet.py), with three stand-in engines and a proxy as
real processes: a version is routed only to the replicas that loaded it and answer its probe like the others;
a replica that cannot load it, or answers with other weights, is out of rotation for it (counted, logged, its
rollouts served by the others) and is taken back once a retry verifies it. And rollout-sticky routing that
survives a change of fleet (proxy/upstream.py): adding or removing one of N replicas moves about 1/N of the
rollouts."""
from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from engine import lifecycle
from engine.adapters import EngineAdapters, LoadFailed
from engine.fleet import agrees, folder_digest, probe
from proxy.upstream import UpstreamPool, rendezvous
from store import policies, replicas
from store.db import open_database, session_factory
from store.models import Call
from tests.support import adapter_folder, free_port, running, running_proxy, stop, stub_command, wait_http
from trainer.metrics import TrainerMetrics
from trainer.publish import Publisher

ROLLOUTS = 30


@dataclass
class Fleet:
    proxy: str
    urls: list[str]
    stack: ExitStack
    processes: list
    tmp_path: Path

    def restart(self, n: int, *flags: str) -> None:
        """Replica `n` stops and starts again on its port with these flags (it forgets its adapters)."""
        stop(self.processes[n])
        port = int(self.urls[n].rsplit(":", 1)[1])
        self.processes[n] = self.stack.enter_context(running(
            stub_command(port) + list(flags), f"{self.urls[n]}/health", log_path=self.tmp_path / f"replica-{n}.log"))


@contextmanager
def fleet(database_url: str, tmp_path: Path, *controls: list[str]):
    """One stand-in engine per entry of `controls` (its extra flags) and a proxy in front of them all."""
    urls = [f"http://127.0.0.1:{free_port()}" for _ in controls]
    with ExitStack() as stack:
        # All started at once, then waited for: each takes a second or so to start.
        processes = [stack.enter_context(running(stub_command(int(url.rsplit(":", 1)[1])) + flags, None,
                                                 log_path=tmp_path / f"replica-{n}.log"))
                     for n, (url, flags) in enumerate(zip(urls, controls))]
        for url, process in zip(urls, processes):
            wait_http(f"{url}/health", 60, process)
        proxy = stack.enter_context(running_proxy(urls, database_url, tmp_path, "proxy", "--served-model",
                                                  "stub-model"))
        yield Fleet(proxy, urls, stack, processes, tmp_path)


async def until(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.2)


async def serving(http: aiohttp.ClientSession, proxy: str) -> int:
    async with http.get(f"{proxy}/policies") as response:
        return (await response.json())["active"]


async def call(http: aiohttp.ClientSession, proxy: str, rollout: str) -> tuple[str, int]:
    """One chat call of `rollout`: (its recorded call id, the policy version that answered)."""
    async with http.post(f"{proxy}/v1/chat/completions", headers={"X-Rollout-Id": rollout},
                         json={"model": "stub-model", "messages": [{"role": "user", "content": "hi"}]}) as response:
        assert response.status == 200, await response.text()
        return response.headers["X-Rlproxy-Call-Id"], int(response.headers["X-Rlproxy-Policy"])


async def served_by(sessions, call_ids: list[str]) -> dict[str, str]:
    """call id -> the replica that answered it, once the proxy's writer has stored them all."""
    found: dict[str, str] = {}

    async def stored() -> bool:
        async with sessions() as session:
            found.update((await session.execute(select(Call.id, Call.upstream).where(Call.id.in_(call_ids)))).all())
        return len(found) == len(call_ids)

    await until(stored, "the proxy did not store the calls")
    return found


async def proxy_metric(http: aiohttp.ClientSession, proxy: str, name: str, labels: dict[str, str]) -> float | None:
    async with http.get(f"{proxy}/metrics") as response:
        text = await response.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None


async def held(http: aiohttp.ClientSession, replica: str) -> dict[str, str]:
    async with http.get(f"{replica}/v1/models") as response:
        return {m["id"]: m["root"] for m in (await response.json())["data"] if m["parent"]}


async def state_of(sessions, version: int, replica: str) -> str | None:
    async with sessions() as session:
        row = (await replicas.states(session, version)).get(replica)
    return row.state if row is not None else None


async def add_versions(sessions, root: Path, versions: list[int]) -> tuple[dict[int, str], dict[int, str]]:
    """Candidate versions: (version -> its adapter folder, version -> the adapter name its row keeps)."""
    folders, names = {}, {}
    async with sessions() as session, session.begin():
        for version in versions:
            folders[version] = adapter_folder(root, version)
            row = await policies.add_candidate(session, version, folders[version], parent_version=version - 1,
                                               base_model="stub-model", metrics={})
            names[version] = row.name
    return folders, names


async def test_a_replica_that_cannot_load_a_version_serves_none_of_it_until_it_can(own_database_url, tmp_path):
    store = open_database(own_database_url)
    sessions = session_factory(store)
    metrics = TrainerMetrics()
    rollouts = [uuid.uuid4().hex for _ in range(ROLLOUTS)]
    try:
        with fleet(own_database_url, tmp_path, [], [], ["--refuse-adapter", "v2"]) as replicas_up:
            proxy, urls = replicas_up.proxy, replicas_up.urls
            bad = urls[2]
            async with aiohttp.ClientSession() as http:
                folders, names = await add_versions(sessions, tmp_path / "adapters", [1, 2])
                publisher = Publisher(sessions, urls, metrics=metrics.fleet, drain_seconds=60)
                first = await publisher.publish(1, folders[1])
                assert first.activated and first.withheld == {}
                await until(lambda: _equals(serving(http, proxy), 1), "the proxy did not serve v1")

                # A streamed call of v1 in flight on the replica that will refuse v2 (a rollout it ranks first).
                on_bad = next(r for r in rollouts if rendezvous(r, urls)[0] == bad)
                in_flight = await http.post(f"{proxy}/v1/chat/completions", headers={"X-Rollout-Id": on_bad}, json={
                    "model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                    "stub_delay": 0.2})
                assert in_flight.status == 200 and in_flight.headers["X-Rlproxy-Policy"] == "1"
                await in_flight.content.readline()  # it has begun

                second = await publisher.publish(2, folders[2])
                assert second.activated and set(second.withheld) == {bad} and "refuse" in second.withheld[bad]
                assert metrics.registry.get_sample_value("rlproxy_fleet_withheld_total",
                                                         {"replica": bad, "reason": "load"}) == 1
                assert (await in_flight.read()).decode().rstrip().endswith("data: [DONE]")  # v1 finished it there
                in_flight.release()

                await until(lambda: _equals(serving(http, proxy), 2), "the proxy did not serve v2")
                sent = [await call(http, proxy, r) for r in rollouts]
                assert {version for _, version in sent} == {2}
                upstream = await served_by(sessions, [call_id for call_id, _ in sent])
                for rollout, (call_id, _) in zip(rollouts, sent):
                    home = rendezvous(rollout, urls)[0]
                    # the good replicas' rollouts stay; the refusing one's go to their next choice
                    assert upstream[call_id] == (home if home != bad else rendezvous(rollout, urls[:2])[0])
                assert await proxy_metric(http, proxy, "rlproxy_fleet_replica_out_of_rotation",
                                          {"policy": "default", "replica": bad}) == 1

                # The replica comes good (started again without the flaw): a retry takes it back for v2.
                replicas_up.restart(2)
                await until(lambda: _equals(state_of(sessions, 2, bad), replicas.VERIFIED),
                            "the replica that came good was not taken back", timeout=40)
                assert (await held(http, bad))[names[2]] == folders[2]
                await until(lambda: _equals(proxy_metric(http, proxy, "rlproxy_fleet_rejoined_total",
                                                         {"replica": bad}), 1), "the rejoin was not counted")
                await asyncio.sleep(1.2)  # past a policy refresh of the proxy
                async with http.get(f"{proxy}/readyz"):  # it looks at its engines: it may have seen this one restart
                    pass
                back = [await call(http, proxy, r) for r in rollouts if rendezvous(r, urls)[0] == bad]
                upstream = await served_by(sessions, [call_id for call_id, _ in back])
                assert back and set(upstream.values()) == {bad} and {version for _, version in back} == {2}
                assert await proxy_metric(http, proxy, "rlproxy_fleet_replica_out_of_rotation",
                                          {"policy": "default", "replica": bad}) is None
    finally:
        await store.dispose()


async def test_a_replica_with_other_weights_is_left_out_and_a_split_fleet_serves_nothing(own_database_url,
                                                                                       tmp_path):
    store = open_database(own_database_url)
    sessions = session_factory(store)
    metrics = TrainerMetrics()
    rollouts = [uuid.uuid4().hex for _ in range(ROLLOUTS)]
    try:
        with fleet(own_database_url, tmp_path, [], [], ["--logprob-shift", "0.5"]) as replicas_up:
            proxy, urls = replicas_up.proxy, replicas_up.urls
            good, other_good, skewed = urls
            async with aiohttp.ClientSession() as http:
                folders, names = await add_versions(sessions, tmp_path / "adapters", [1, 2])
                published = await Publisher(sessions, urls, metrics=metrics.fleet).publish(1, folders[1])
                assert published.activated and set(published.withheld) == {skewed}
                assert "probe" in published.withheld[skewed]
                assert metrics.registry.get_sample_value("rlproxy_fleet_withheld_total",
                                                         {"replica": skewed, "reason": "probe"}) == 1
                assert names[1] not in await held(http, skewed)  # its copy with other weights is gone
                async with sessions() as session:
                    record = await replicas.fleet_record(session, 1)
                assert record.digest == folder_digest(folders[1]) and record.probe.logprob == pytest.approx(-0.05)

                await until(lambda: _equals(serving(http, proxy), 1), "the proxy did not serve v1")
                sent = [await call(http, proxy, r) for r in rollouts]
                upstream = await served_by(sessions, [call_id for call_id, _ in sent])
                assert {version for _, version in sent} == {1} and set(upstream.values()) == {good, other_good}

                # Two replicas that disagree: neither is a majority, so the version never serves, nowhere kept.
                split = await Publisher(sessions, [good, skewed]).publish(2, folders[2])
                assert not split.activated and "not a majority" in split.error
                assert (await policies_status(sessions, 2)) == "failed"
                for replica in (good, skewed):
                    assert names[2] not in await held(http, replica)

                # v1's folder rewritten after it was committed: a replica that lost its copy may not load it again.
                (Path(folders[1]) / "adapter_model.safetensors").write_bytes(b"other weights")
                assert names[1] in await held(http, other_good)
                await EngineAdapters([other_good]).unload(names[1])  # as an engine restart does
                with pytest.raises(LoadFailed) as refused:
                    await lifecycle.ensure_loaded(sessions, EngineAdapters([other_good]), 1)
                assert "is not the folder v1 was committed with" in str(refused.value)
                assert names[1] not in await held(http, other_good)
                assert await state_of(sessions, 1, other_good) == replicas.WITHHELD
                await asyncio.sleep(1.2)  # past a policy refresh: v1 is served by the one replica left
                sent = [await call(http, proxy, r) for r in rollouts[:10]]
                assert set((await served_by(sessions, [c for c, _ in sent])).values()) == {good}
    finally:
        await store.dispose()


@pytest.mark.engine
async def test_the_probe_reads_the_real_engines_top_token_and_logprob(engine_url, engine_model):
    """The probe's request and its reading of the answer, against vLLM itself (the stand-in only imitates it):
    at temperature 0 the same replica answers the same token, with a logprob within the tolerance."""
    engine = EngineAdapters([engine_url])
    first, again = [await probe(engine, engine_url, engine_model) for _ in range(2)]
    assert first.token and -20 < first.logprob <= 0 and agrees(again, first)


async def policies_status(sessions, version: int) -> str:
    async with sessions() as session:
        return (await policies.get_policy(session, version)).status


async def _equals(value, expected) -> bool:
    return await value == expected


# --- rollout-sticky routing over a changing fleet -------------------------------------------------------------

IDS = [f"rollout-{i:05d}" for i in range(10_000)]
MOVE_BOUND = 0.02  # absolute: the binomial spread of 10,000 ids is below 0.005 at these fractions
BALANCE_BOUND = 0.02  # absolute, on each replica's share 1/N


def replicas_of(n: int) -> list[str]:
    return [f"http://engine-{i}:8000" for i in range(n)]


@pytest.mark.parametrize("n", range(2, 9))
def test_adding_or_removing_one_of_n_replicas_moves_about_one_nth_of_the_rollouts(n):
    before = {r: rendezvous(r, replicas_of(n))[0] for r in IDS}
    grown = {r: rendezvous(r, replicas_of(n + 1))[0] for r in IDS}
    moved = [r for r in IDS if grown[r] != before[r]]
    assert abs(len(moved) / len(IDS) - 1 / (n + 1)) < MOVE_BOUND
    assert {grown[r] for r in moved} == {replicas_of(n + 1)[-1]}  # only to the new one

    gone = replicas_of(n)[0]
    shrunk = {r: rendezvous(r, replicas_of(n)[1:])[0] for r in IDS}
    moved = [r for r in IDS if shrunk[r] != before[r]]
    assert abs(len(moved) / len(IDS) - 1 / n) < MOVE_BOUND
    assert all(before[r] == gone for r in moved)  # only the removed replica's rollouts

    shares = Counter(before.values())
    assert len(shares) == n and all(abs(count / len(IDS) - 1 / n) < BALANCE_BOUND for count in shares.values())


def test_a_replica_out_of_rotation_for_a_version_moves_only_its_own_rollouts_of_that_version():
    urls = replicas_of(4)
    pool = UpstreamPool(urls, timeout=10)
    pool.withhold({"rlproxy-v2": frozenset({urls[1]})})
    for rollout in IDS[:2000]:
        home = rendezvous(rollout, urls)[0]
        assert pool.choose(rollout, model="rlproxy-v1").url == home  # another version: untouched
        expected = home if home != urls[1] else rendezvous(rollout, [u for u in urls if u != urls[1]])[0]
        assert pool.choose(rollout, model="rlproxy-v2").url == expected
    pool.withhold({"rlproxy-v2": frozenset(urls)})  # every replica lost it: served anyway, as when all are down
    assert pool.choose(IDS[0], model="rlproxy-v2").url == rendezvous(IDS[0], urls)[0]
