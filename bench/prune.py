"""What retention costs a serving proxy: a Postgres store filled with old, trained rollouts (two calls each, with
bodies like an agent's), `rlproxy serve` in front of the stand-in engine answering a steady load, and
`rlproxy prune` run beside it. Prints the calls table's size before and after, how long pruning took, and the
proxy's latency p50/p99 before and while it runs, as ratios measured in this one run.

    .venv/bin/python bench/prune.py [--rollouts 20000] [--concurrency 8] [--what calls|bodies]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import aiohttp
import orjson
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from testkit.processes import (  # noqa: E402
    create_database,
    free_port,
    proxy_command,
    rlproxy_command,
    running,
    stub_command,
)

BODY = orjson.dumps({"model": "stub-model", "messages": [{"role": "user", "content": "What is 6 times 7?"}],
                     "max_tokens": 8})
# An agent's turn as it is stored: a system prompt, a few turns, and the engine's answer (about 2 KB each).
REQUEST = {"model": "m", "messages": [{"role": "system", "content": "You are a careful assistant. " * 20},
                                      {"role": "user", "content": "Please compute the total of the invoice. " * 8}]}
RESPONSE = {"choices": [{"message": {"role": "assistant", "content": "The total is 42. " * 30}}]}


def fill(libpq_url: str, rollouts: int) -> None:
    """Old, trained rollouts with two recorded calls each, written with COPY (seconds, not minutes)."""
    old = time.strftime("%Y-%m-%d %H:%M:%S+00", time.gmtime(time.time() - timedelta(days=60).total_seconds()))
    request, response = orjson.dumps(REQUEST).decode(), orjson.dumps(RESPONSE).decode()
    with psycopg.connect(libpq_url) as conn, conn.cursor() as cur:
        with cur.copy("COPY rollouts (id, status, reward, eval, call_count, created_at, finished_at, trained_at) "
                      "FROM STDIN") as copy:
            for i in range(rollouts):
                copy.write_row((f"r{i}", "finished", 1.0, False, 2, old, old, old))
        with cur.copy("COPY calls (id, rollout_id, seq, route, status, stream, started_at, request, response, "
                      "prompt_token_ids) FROM STDIN") as copy:
            for i in range(rollouts):
                for seq in (0, 1):
                    copy.write_row((f"c{i}-{seq}", f"r{i}", seq, "chat", "ok", False, old, request, response,
                                    "{1,2,3,4,5,6,7,8}"))
        conn.commit()


def calls_table(libpq_url: str) -> tuple[int, float]:
    """(rows, MB) of the calls table; the size after a VACUUM, which makes deleted rows' space reusable (the
    file keeps its size: Postgres reuses the space for new calls rather than giving it back)."""
    with psycopg.connect(libpq_url, autocommit=True) as conn:
        conn.execute("VACUUM calls")
        rows = conn.execute("SELECT count(*) FROM calls").fetchone()[0]
        return rows, conn.execute("SELECT pg_total_relation_size('calls')").fetchone()[0] / 1e6


async def latencies(url: str, concurrency: int, until) -> list[float]:
    """Chat calls through the proxy, `concurrency` at a time, until `until()` says stop."""
    found: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        async def worker() -> None:
            while not until():
                began = time.perf_counter()
                async with session.post(url, data=BODY, headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    assert r.status == 200, r.status
                found.append(time.perf_counter() - began)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return found


def quantiles(values: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(values, n=100)
    return cuts[49] * 1000, cuts[98] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--rollouts", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--baseline-seconds", type=float, default=10.0)
    parser.add_argument("--what", default="calls", choices=["calls", "bodies"])
    args = parser.parse_args()

    database = create_database(args.postgres, "bench_prune")
    libpq_url = database.replace("postgresql+asyncpg://", "postgresql://", 1)
    fill(libpq_url, args.rollouts)
    rows_before, before_mb = calls_table(libpq_url)
    stub_port, proxy_port = free_port(), free_port()
    stub = f"http://127.0.0.1:{stub_port}"
    with tempfile.TemporaryDirectory() as work, \
            running(stub_command(stub_port), stub + "/health"), \
            running(proxy_command(proxy_port, [stub], database, "--spool-path", f"{work}/spool.jsonl"),
                    f"http://127.0.0.1:{proxy_port}/readyz"):
        url = f"http://127.0.0.1:{proxy_port}/v1/chat/completions"
        end = time.monotonic() + args.baseline_seconds
        baseline = asyncio.run(latencies(url, args.concurrency, lambda: time.monotonic() > end))
        began = time.monotonic()
        pruning = subprocess.Popen(rlproxy_command("prune", "--database-url", database, "--older-than", "30d",
                                                   "--what", args.what), stdout=subprocess.PIPE, text=True)
        during = asyncio.run(latencies(url, args.concurrency, lambda: pruning.poll() is not None))
        took = time.monotonic() - began
        said = pruning.stdout.read().strip()
    rows_after, after_mb = calls_table(libpq_url)
    (p50, p99), (q50, q99) = quantiles(baseline), quantiles(during)
    print(said)
    print(f"calls table: {rows_before} rows, {before_mb:.0f} MB before; {rows_after} rows, {after_mb:.0f} MB after "
          f"(vacuumed: the space is reused for new calls); pruning took {took:.1f} s while serving")
    print(f"proxy latency at concurrency {args.concurrency}: p50 {p50:.2f} -> {q50:.2f} ms ({q50 / p50:.2f}x), "
          f"p99 {p99:.2f} -> {q99:.2f} ms ({q99 / p99:.2f}x); {len(baseline)} calls before, {len(during)} during")


if __name__ == "__main__":
    main()
