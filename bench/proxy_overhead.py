"""What the proxy costs: the same load straight to the stub engine and through `rlproxy serve` (recording into
Postgres), interleaved in one run. Prints added latency p50/p99 and the throughput ratio at several
concurrency levels, for non-streaming and streaming requests.

    python bench/proxy_overhead.py [--database-url postgresql+asyncpg://postgres@127.0.0.1:5432/test]
                                   [--seconds 4] [--levels 1,16,64]
Stub, proxy, Postgres and this load generator share the machine's cores; the ratios are what count.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from testkit.processes import free_port, proxy_command, running, stub_command  # noqa: E402

MESSAGES = [{"role": "user", "content": "What is 6 times 7?"}]
BODY = {"model": "stub-model", "messages": MESSAGES, "max_tokens": 8}
# The same prompt and token budget in each wire format the proxy serves, and the route each is posted to.
BODIES = {"chat": BODY,
          "responses": {"model": "stub-model", "input": MESSAGES[0]["content"], "max_output_tokens": 8},
          "messages": {"model": "stub-model", "max_tokens": 8, "messages": MESSAGES}}
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
# A Responses or Messages stream answers HTTP 200 before it knows how it ends: it counts only once its last
# event arrived (a failure there is an `error` event, which would otherwise pass for a quick answer).
STREAM_ENDS = {"responses": (b"event: response.completed", b"event: response.incomplete"),
               "messages": (b"event: message_stop",)}


async def one(session: aiohttp.ClientSession, url: str, stream: bool, api: str = "chat") -> float:
    began = time.perf_counter()
    async with session.post(url, data=orjson.dumps({**BODIES[api], "stream": stream}),
                            headers={"Content-Type": "application/json"}) as response:
        body = await response.read()
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}")
        if stream and api in STREAM_ENDS and not any(end in body for end in STREAM_ENDS[api]):
            raise RuntimeError(f"{url}: the stream ended without its last event")
    return time.perf_counter() - began


async def load(url: str, concurrency: int, seconds: float, stream: bool) -> tuple[list[float], float]:
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(min(concurrency, 8)):
            await one(session, url, stream)  # warm the connections
        deadline = time.perf_counter() + seconds
        began = time.perf_counter()

        async def worker() -> None:
            while time.perf_counter() < deadline:
                latencies.append(await one(session, url, stream))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    return latencies, len(latencies) / elapsed


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


async def measure(direct: str, proxied: str, levels: list[int], seconds: float, rounds: int) -> list[dict]:
    rows = []
    for stream in (False, True):
        for level in levels:
            samples = {"direct": ([], []), "proxy": ([], [])}
            for _ in range(rounds):  # interleave so drift affects both sides alike
                for name, url in (("direct", direct), ("proxy", proxied)):
                    latencies, rate = await load(url, level, seconds / rounds, stream)
                    samples[name][0].extend(latencies)
                    samples[name][1].append(rate)
            d_lat, d_rates = samples["direct"]
            p_lat, p_rates = samples["proxy"]
            rows.append({
                "stream": stream, "concurrency": level,
                "direct_rps": statistics.mean(d_rates), "proxy_rps": statistics.mean(p_rates),
                "added_p50_ms": (pct(p_lat, 50) - pct(d_lat, 50)) * 1000,
                "added_p99_ms": (pct(p_lat, 99) - pct(d_lat, 99)) * 1000,
            })
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'mode':<10}{'conc':>5}{'direct req/s':>14}{'proxy req/s':>13}{'ratio':>8}"
          f"{'added p50 ms':>14}{'added p99 ms':>14}")
    for row in rows:
        print(f"{'stream' if row['stream'] else 'json':<10}{row['concurrency']:>5}{row['direct_rps']:>14.0f}"
              f"{row['proxy_rps']:>13.0f}{row['proxy_rps'] / row['direct_rps']:>8.2f}"
              f"{row['added_p50_ms']:>14.2f}{row['added_p99_ms']:>14.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default="postgresql+asyncpg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--seconds", type=float, default=4.0, help="Seconds of load per cell and side.")
    parser.add_argument("--rounds", type=int, default=2, help="Interleaved rounds per cell.")
    parser.add_argument("--levels", default="1,16,64")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="rlproxy-bench-"))
    stub_port, proxy_port = free_port(), free_port()
    stub = f"http://127.0.0.1:{stub_port}"
    proxy = f"http://127.0.0.1:{proxy_port}"
    with running(stub_command(stub_port), stub + "/health", log_path=workdir / "stub.log"), \
         running(proxy_command(proxy_port, [stub], args.database_url, "--spool-path", str(workdir / "spool.jsonl")),
                 proxy + "/healthz", log_path=workdir / "proxy.log"):
        rows = asyncio.run(measure(f"{stub}/v1/chat/completions", f"{proxy}/v1/chat/completions", levels,
                                   args.seconds, args.rounds))
    print_table(rows)


if __name__ == "__main__":
    main()
