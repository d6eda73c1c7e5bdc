"""A capacity model for the proxy tier: 1, 2 and 4 `rlproxy serve` processes (each on its own port, with auth
on and the default `spool` durability, as the Helm chart runs them) recording into one Postgres database, with
the load spread over them, in front of the stand-in engine (testkit/stub_engine.py).

For each size it prints recorded calls per second overall and per proxy process, the CPU the proxies used and
the calls per proxy core-second, the Postgres connections the proxies opened (against the pools' configured
size) with the calls per connection, what Postgres' own backends spent per call and how many calls each commit
carried; then it counts the `calls` rows: every acknowledged call must be there. Last, what a number of
concurrent agents implies (proxy processes, cores, Postgres connections), with the assumptions printed.

    python bench/proxy_tier.py [--database-url postgresql+asyncpg://postgres@127.0.0.1:5432/test]
                               [--processes 1,2,4] [--seconds 15] [--clients-per-process 32]
                               [--agents 10000] [--calls-per-agent-second 0.2] [--utilization 0.5]

Everything (stub, proxies, Postgres, this load generator) shares the machine's cores: calls per proxy
core-second is the figure that carries to other machines; throughput is this machine's. The load averages are
printed so a run on a busy machine can be told from one on a quiet machine.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
import psutil
import psycopg
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from store.db import open_database  # noqa: E402
from testkit.processes import free_port, fresh_database, proxy_command, rlproxy_command, running, stub_command  # noqa: E402

ADMIN_KEY = "proxy-tier-bench-admin"
# The pool each proxy process opens (store/db.py): pool_size connections plus as many again in overflow.
POOL_SIZE = inspect.signature(open_database).parameters["pool_size"].default
POOL_MAX = 2 * POOL_SIZE
CALLS_PER_ROLLOUT = 8  # an agent's rollout: this many calls under one X-Rollout-Id


def agent_body(prompt_words: int, completion_words: int) -> bytes:
    """A chat call the size of an agent's turn: a system prompt and history of `prompt_words` words, and a
    completion of `completion_words` tokens (the stub answers `stub_reply`, one token a word)."""
    history = " ".join(f"word{i % 97}" for i in range(prompt_words))
    return orjson.dumps({
        "model": "stub-model", "max_tokens": completion_words + 1, "logprobs": True,
        "messages": [{"role": "system", "content": "You are an agent with tools."},
                     {"role": "user", "content": history}],
        "stub_reply": " ".join(f"reply{i % 13}" for i in range(completion_words))})


def libpq(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


class PostgresWatch:
    """Samples, on a thread of its own, the server's backends serving one database: how many are open (and
    active), and the CPU each spent, read from /proc (the server runs on this machine). Backends open at the
    first sample count from there; later ones count whole."""

    def __init__(self, server: str, database: str, ignore: set[int]) -> None:
        self.server, self.database, self.ignore = server, database, ignore
        self.open: list[int] = []
        self.active: list[int] = []
        self.first: dict[int, float] = {}  # pid -> CPU seconds at the first sample that saw it
        self.last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self, conn: psycopg.Connection) -> None:
        rows = [(pid, state) for pid, state in conn.execute(
            "SELECT pid, state FROM pg_stat_activity WHERE datname = %s", (self.database,)).fetchall()
            if pid not in self.ignore]
        starting = not self.open
        self.open.append(len(rows))
        self.active.append(sum(1 for _, state in rows if state == "active"))
        for pid, _ in rows:
            with contextlib.suppress(psutil.Error):
                spent = cpu_seconds(psutil.Process(pid))
                self.first.setdefault(pid, spent if starting else 0.0)
                self.last[pid] = spent

    def _run(self) -> None:
        with psycopg.connect(self.server, autocommit=True) as conn:
            self._sample(conn)
            self._started.set()
            while not self._stop.wait(0.25):
                self._sample(conn)
            self._sample(conn)

    def __enter__(self) -> "PostgresWatch":
        self._started = threading.Event()
        self._thread.start()
        self._started.wait(30)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def cpu(self) -> float:
        return sum(self.last[pid] - self.first[pid] for pid in self.last)


@dataclass
class Run:
    processes: int
    clients: int
    seconds: float = 0.0        # from the load's start until every acknowledged call was in the database
    load_seconds: float = 0.0   # the load alone
    acknowledged: int = 0       # HTTP 200, whole body read
    errors: int = 0
    stored: int = 0             # rows in `calls` afterwards
    proxy_cpu: float = 0.0      # CPU seconds, over `seconds`
    postgres_cpu: float = 0.0
    stub_cpu: float = 0.0
    generator_cpu: float = 0.0
    writes: int = 0             # write transactions of the proxies' capture writers
    commits: int = 0            # every commit in the database (writes and the proxies' reads)
    peak_connections: int = 0
    median_connections: int = 0
    mean_active: float = 0.0
    load_average: tuple[float, float] = (0.0, 0.0)  # 1-minute, before and after

    @property
    def rate(self) -> float:
        return self.stored / self.seconds


async def drive(urls: list[str], clients_per_process: int, seconds: float, body: bytes, headers: dict,
                run: Run) -> None:
    """`clients_per_process` agents per proxy, each sending its calls back to back to its own proxy, a new
    rollout every CALLS_PER_ROLLOUT calls."""
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout,
                                     headers={**headers, "Content-Type": "application/json"}) as session:
        async def agent(number: int, url: str, until: float) -> None:
            calls = 0
            while time.perf_counter() < until:
                rollout = {"X-Rollout-Id": f"agent{number}-r{calls // CALLS_PER_ROLLOUT}",
                           "X-Agent-Name": "bench"}
                try:
                    async with session.post(url, data=body, headers=rollout) as response:
                        await response.read()
                        if response.status == 200:
                            run.acknowledged += 1
                        else:
                            run.errors += 1
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    run.errors += 1
                calls += 1

        until = time.perf_counter() + seconds
        await asyncio.gather(*(agent(n, urls[n % len(urls)], until)
                               for n in range(clients_per_process * len(urls))))


def create_key(database_url: str) -> str:
    """A project key, created as an operator does (`rlproxy keys create`)."""
    command = rlproxy_command("keys", "create", "--project", "bench", "--database-url", database_url)
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]


def wait_stored(conn: psycopg.Connection, expected: int, patience: float = 60.0) -> int:
    """The `calls` rows once they reach `expected`, or once they stop growing for `patience` seconds."""
    last, since = -1, time.monotonic()
    while True:
        stored = conn.execute("SELECT count(*) FROM calls").fetchone()[0]
        conn.rollback()
        if stored >= expected:
            return stored
        if stored != last:
            last, since = stored, time.monotonic()
        elif time.monotonic() - since > patience:
            return stored
        time.sleep(0.1)


def metric(port: int, name: str) -> float:
    text = requests.get(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                        timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def commits(conn: psycopg.Connection, database: str) -> int:
    query = "SELECT xact_commit FROM pg_stat_database WHERE datname = %s"
    return conn.execute(query, (database,)).fetchone()[0]


def measure(server: str, stub: str, stub_process: psutil.Process, processes: int, args, workdir: Path) -> Run:
    """`processes` proxies on a fresh database, loaded for args.seconds."""
    run = Run(processes, args.clients_per_process * processes)
    body = agent_body(args.prompt_words, args.completion_words)
    with fresh_database(server, prefix="rlproxy_tier") as database_url, contextlib.ExitStack() as stack:
        key = create_key(database_url)
        ports = [free_port() for _ in range(processes)]
        proxies = []
        for number, port in enumerate(ports):  # one after the other: each `serve` imports a lot at start
            command = proxy_command(port, [stub], database_url, "--no-migrate",
                                    "--spool-path", str(workdir / f"spool-{processes}-{number}.jsonl"))
            started = stack.enter_context(running(command, f"http://127.0.0.1:{port}/readyz", timeout=180,
                                                  env={"RLPROXY_ADMIN_KEY": ADMIN_KEY},
                                                  log_path=workdir / f"proxy-{processes}-{number}.log"))
            proxies.append(psutil.Process(started.pid))
        database = database_url.rsplit("/", 1)[1]
        counter = stack.enter_context(psycopg.connect(libpq(database_url)))
        stats = stack.enter_context(psycopg.connect(server, autocommit=True))
        ignore = {counter.execute("SELECT pg_backend_pid()").fetchone()[0]}
        counter.rollback()
        time.sleep(1.0)  # let the proxies' start-up settle
        load_before = os.getloadavg()[0]
        with PostgresWatch(server, database, ignore) as watch:
            committed = commits(stats, database)
            proxy_cpu = [cpu_seconds(p) for p in proxies]
            other_cpu = cpu_seconds(stub_process), cpu_seconds(psutil.Process())
            began = time.perf_counter()
            urls = [f"http://127.0.0.1:{port}/v1/chat/completions" for port in ports]
            asyncio.run(drive(urls, args.clients_per_process, args.seconds, body,
                              {"Authorization": f"Bearer {key}"}, run))
            run.load_seconds = time.perf_counter() - began
            run.stored = wait_stored(counter, run.acknowledged)
            run.seconds = time.perf_counter() - began
            run.proxy_cpu = sum(cpu_seconds(p) for p in proxies) - sum(proxy_cpu)
            run.stub_cpu = cpu_seconds(stub_process) - other_cpu[0]
            run.generator_cpu = cpu_seconds(psutil.Process()) - other_cpu[1]
            run.commits = commits(stats, database) - committed
        run.postgres_cpu = watch.cpu()
        run.peak_connections = max(watch.open)
        run.median_connections = sorted(watch.open)[len(watch.open) // 2]
        run.mean_active = sum(watch.active) / len(watch.active)
        run.writes = round(sum(metric(port, "rlproxy_capture_batch_size_count") for port in ports))
        run.load_average = (load_before, os.getloadavg()[0])
    return run


def print_runs(runs: list[Run]) -> None:
    print(f"\n{'proxies':>7} {'clients':>7} {'calls/s':>7} {'/proxy':>6} {'cores':>5} {'/core-s':>7} "
          f"{'conns':>9} {'pool':>4} {'/conn':>5} {'active':>6} {'pg ms':>6} {'/write':>6} {'load 1m':>10}")
    for r in runs:
        print(f"{r.processes:>7} {r.clients:>7} {r.rate:>7.0f} {r.rate / r.processes:>6.0f} "
              f"{r.proxy_cpu / r.seconds:>5.2f} {r.stored / r.proxy_cpu:>7.0f} "
              f"{f'{r.median_connections}/{r.peak_connections}':>9} {r.processes * POOL_MAX:>4} "
              f"{r.rate / (r.processes * POOL_MAX):>5.1f} {r.mean_active:>6.1f} "
              f"{1000 * r.postgres_cpu / r.stored:>6.3f} {r.stored / max(1, r.writes):>6.1f} "
              f"{r.load_average[0]:>4.1f}->{r.load_average[1]:<4.1f}")
    print(f"""
  calls/s  calls stored / seconds from the load's start until the last one was in Postgres;
           /proxy: per process
  cores    CPU seconds of the proxy processes / those seconds; /core-s: calls per proxy CPU second
  conns    connections open to the database, median/peak of samples every 0.25 s; pool: the pools'
           ceiling, {POOL_SIZE} + {POOL_SIZE} overflow per process (store/db.py); /conn: calls/s per
           connection of that ceiling
  active   connections running a statement, mean of the samples
  pg ms    CPU of the Postgres backends serving the database, per call (its WAL and background writers
           not counted)
  /write   calls per write transaction of the proxies' capture writers
  load 1m  the machine's 1-minute load average before and after""")
    print("\ncalls: acknowledged (HTTP 200), errors, stored (rows in `calls`), lost (acknowledged - stored); "
          "CPU seconds spent")
    for r in runs:
        print(f"  {r.processes} proxies: acknowledged={r.acknowledged} errors={r.errors} stored={r.stored} "
              f"lost={max(0, r.acknowledged - r.stored)}; {r.commits} commits ({r.writes} writes); the last "
              f"call stored {r.seconds - r.load_seconds:.1f} s after the load; CPU seconds in those "
              f"{r.seconds:.1f} s: proxies {r.proxy_cpu:.1f}, Postgres backends {r.postgres_cpu:.1f}, "
              f"stub {r.stub_cpu:.1f}, "
              f"load generator {r.generator_cpu:.1f}")


def print_projection(runs: list[Run], args, max_connections: int) -> None:
    calls = sum(r.stored for r in runs)
    per_core = calls / sum(r.proxy_cpu for r in runs)
    pg_per_call = sum(r.postgres_cpu for r in runs) / calls
    peak_per_process = max(r.peak_connections / r.processes for r in runs)
    median_per_process = max(r.median_connections / r.processes for r in runs)
    needed = args.agents * args.calls_per_agent_second
    processes = math.ceil(needed / (per_core * args.utilization))
    pg_cores = needed * pg_per_call / args.utilization
    print(f"\n{args.agents:,} concurrent agents")
    print(f"  assumptions: each agent makes {args.calls_per_agent_second:g} calls/s (one call every "
          f"{1 / args.calls_per_agent_second:g} s: generation plus the agent's own work); calls the size "
          f"measured here ({args.prompt_words} prompt words, {args.completion_words} completion tokens, "
          f"non-streaming); every core planned at {args.utilization:.0%} of what it did here (bursts, bigger "
          f"calls)")
    print(f"  measured (all rows above): {per_core:.0f} calls per proxy core-second; "
          f"{pg_per_call * 1000:.3f} ms of Postgres backend CPU per call; per proxy process up to "
          f"{median_per_process:.1f} connections open (median), {peak_per_process:.1f} at peaks")
    print(f"  -> {needed:,.0f} calls/s to record")
    print(f"  -> {processes} proxy processes (one core each: a process runs one event loop), "
          f"{math.ceil(pg_cores)} Postgres cores for the backends ({pg_cores:.2f}), "
          f"{processes + math.ceil(pg_cores)} cores in all")
    print(f"  -> Postgres connections: {processes * POOL_MAX} at the pools' ceiling ({processes} x "
          f"{POOL_MAX}), reached at peaks as measured, about "
          f"{math.ceil(processes * median_per_process)} open "
          f"most of the time; this server allows max_connections={max_connections}")
    print(f"  -> {args.agents / processes:,.0f} agents per proxy process")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default="postgresql+asyncpg://postgres@127.0.0.1:5432/test",
                        help="A Postgres server (any database on it) to create the bench databases on.")
    parser.add_argument("--processes", default="1,2,4", help="Proxy process counts to measure.")
    parser.add_argument("--seconds", type=float, default=15.0, help="Seconds of load per count.")
    parser.add_argument("--clients-per-process", type=int, default=32,
                        help="Agents sending back to back, per proxy process.")
    parser.add_argument("--prompt-words", type=int, default=300,
                        help="Prompt size (the stub counts a token a word).")
    parser.add_argument("--completion-words", type=int, default=64, help="Completion tokens per call.")
    parser.add_argument("--agents", type=int, default=10_000, help="Concurrent agents to size the tier for.")
    parser.add_argument("--calls-per-agent-second", type=float, default=0.2,
                        help="Calls per agent per second (assumption).")
    parser.add_argument("--utilization", type=float, default=0.5,
                        help="Share of a core's measured capacity to plan for (assumption).")
    args = parser.parse_args()
    server = libpq(args.database_url)
    workdir = Path(tempfile.mkdtemp(prefix="rlproxy-proxy-tier-"))
    with psycopg.connect(server) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        max_connections = int(conn.execute("SHOW max_connections").fetchone()[0])
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB; load average "
          f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the start; Postgres {version} on the same machine")
    print(f"each call: chat, {args.prompt_words} prompt words, {args.completion_words} completion tokens "
          f"with "
          f"logprobs, a rollout id (a new rollout every {CALLS_PER_ROLLOUT} calls), a project key; proxies: "
          f"`rlproxy serve` with auth on and the default durability (spool); {args.seconds:g} s of load "
          f"per row")
    port = free_port()
    stub = f"http://127.0.0.1:{port}"
    runs = []
    with running(stub_command(port), stub + "/health", log_path=workdir / "stub.log") as stub_process:
        for processes in (int(n) for n in args.processes.split(",")):
            runs.append(measure(server, stub, psutil.Process(stub_process.pid), processes, args, workdir))
            print(f"  measured {processes} proxies", file=sys.stderr, flush=True)
    print_runs(runs)
    print_projection(runs, args, max_connections)
    lost = sum(max(0, r.acknowledged - r.stored) for r in runs)
    print(f"\nevery acknowledged call stored: {'yes' if not lost else f'NO, {lost} lost'}; logs: {workdir}")
    if lost or any(r.errors for r in runs):
        sys.exit(1)


if __name__ == "__main__":
    main()
