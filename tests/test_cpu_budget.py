"""The proxy's CPU budget per recorded call, held as a ratio: `rlproxy serve` (the default `spool` durability,
recording into Postgres) and the stub engine behind it, under the same 16 clients in one short interleaved run,
each process's calls per CPU second (user+sys, psutil). The stub is an aiohttp server answering from memory: what it
spends per call is the cost of an HTTP exchange on this machine, so the ratio hardly moves with the machine or its
other load, while a change that makes the recording path cost twice the CPU halves it.

bench/load.py prints the same ratio at 16 clients (bench/cpu_budget.py) with the full measurement; the floor here
is generous (measured 0.16-0.21 on a loaded 2-core machine, docs/performance.md): noise must not fail it."""
from __future__ import annotations

import asyncio
import time

import aiohttp
import orjson
import psutil
import pytest

from testkit.processes import free_port, fresh_database, proxy_command, running, stub_command

FLOOR = 0.11  # proxy calls per CPU second / the stub's; a 2x regression of today's 0.16-0.21 lands below it
CLIENTS = 16
ROUNDS = 3
SECONDS = 0.75  # per target and round
BODY = orjson.dumps({"model": "stub-model", "messages": [{"role": "user", "content": "What is 6 times 7?"}],
                    "max_tokens": 8})


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


@pytest.fixture(scope="module")
def served(postgres_server: str, tmp_path_factory):
    """The stub engine and a proxy in front of it, as processes whose CPU time can be read."""
    workdir = tmp_path_factory.mktemp("cpu-budget")
    stub_port, port = free_port(), free_port()
    stub, url = f"http://127.0.0.1:{stub_port}", f"http://127.0.0.1:{port}"
    with running(stub_command(stub_port), stub + "/health", log_path=workdir / "stub.log") as engine, \
            fresh_database(postgres_server, prefix="rlproxy_cpu") as database_url, \
            running(proxy_command(port, [stub], database_url, "--no-migrate", "--spool-path",
                                  str(workdir / "spool.jsonl")), url + "/readyz",
                    log_path=workdir / "proxy.log") as proxy:
        yield {"stub": (stub, psutil.Process(engine.pid)), "proxy": (url, psutil.Process(proxy.pid))}


async def _load(url: str, seconds: float) -> int:
    """CLIENTS clients back to back for `seconds`; the calls answered with 200 (anything else fails the test)."""
    done = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CLIENTS)) as session:
        deadline = time.perf_counter() + seconds

        async def client() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                async with session.post(url + "/v1/chat/completions", data=BODY,
                                        headers={"Content-Type": "application/json"}) as response:
                    await response.read()
                    assert response.status == 200, await response.text()
                    done += 1

        await asyncio.gather(*(client() for _ in range(CLIENTS)))
    return done


async def _calls_per_cpu_second(served: dict) -> dict[str, float]:
    calls = {name: 0 for name in served}
    cpu = {name: 0.0 for name in served}
    for name, (url, _) in served.items():
        await _load(url, 0.3)  # connections and code warm
    for number in range(ROUNDS):
        for name in sorted(served, reverse=bool(number % 2)):  # interleaved, in alternating order
            url, process = served[name]
            before = cpu_seconds(process)
            calls[name] += await _load(url, SECONDS)
            cpu[name] += cpu_seconds(process) - before
    return {name: calls[name] / cpu[name] for name in served}


async def test_a_recorded_call_costs_the_proxy_within_its_cpu_budget(served):
    rates = await _calls_per_cpu_second(served)
    ratio = rates["proxy"] / rates["stub"]
    print(f"proxy {rates['proxy']:.0f} and stub {rates['stub']:.0f} calls per CPU second: {ratio:.3f}")
    assert ratio >= FLOOR, (f"the proxy answers {rates['proxy']:.0f} recorded calls per CPU second, the stub "
                            f"{rates['stub']:.0f}: {ratio:.3f} of the stub's, below the floor {FLOOR} (profile it: "
                            "bench/profile_recording.py)")
