"""One load generator against several OpenAI-compatible proxies in front of the same stub engine: the stub
itself, `rlproxy serve` recording into Postgres with `--durability spool` (the default), `batch` and `sync`,
LiteLLM's proxy (no database), Agent Lightning's LLM proxy and rllm-model-gateway. Non-streaming and streaming
chat at several concurrency levels, the targets interleaved cell by cell; prints throughput, the latency each
adds to the stub's (p50/p99), throughput relative to LiteLLM, and lost calls (acknowledged but not stored) where
the target stores calls somewhere we can count.

`rlproxy-responses` and `rlproxy-messages` send the same prompt and token budget as the OpenAI Responses API
(`/v1/responses`) and Anthropic Messages (`/v1/messages`) to the very `rlproxy-batch` process, which translates
them to chat for the stub: their cells differ from its chat cells by the wire format alone. Each cell is split
into `--rounds` rounds, every target once per round in an order that rotates from round to round; the table is
followed by their p50 minus chat's in the same round, the median over rounds with a distribution-free
confidence interval for it (the noise), against the bound of 0.2 ms; and so are `rlproxy-spool` and `rlproxy-sync`
against `rlproxy-batch` (what recording each call in the spool before its answer costs). Every cell also shows
the CPU its serving process spent per answered call (psutil: user+sys over the measured windows), and the run ends
with the CPU budget at 16 clients: each target's calls per CPU second against the stub's (bench/cpu_budget.py).

    python bench/load.py [--database-url postgresql+asyncpg://postgres@127.0.0.1:5432/test]
                         [--seconds 3] [--rounds 5] [--levels 1,16,64,256] [--only stub,rlproxy-batch,...]
                         [--quick]
The third-party proxies are installed on first use, each into its own virtualenv under
~/.cache/rlproxy/bench-venvs (pip from PyPI); one that cannot be installed or started is reported and
skipped. Everything shares the machine's cores with the load generator: compare within one run.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import aiohttp
import psutil
import psycopg
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.proxy_overhead import PATHS, one, pct  # noqa: E402
from bench.cpu_budget import cpu_seconds, machine, print_cpu_budget  # noqa: E402
from bench.wire_formats import print_wire_formats  # noqa: E402
from testkit.processes import free_port, fresh_database, proxy_command, running, stub_command  # noqa: E402

VENVS = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rlproxy" / "bench-venvs"
# Like rlproxy here (no keys), LiteLLM runs without authentication; it has to be told that this is on purpose.
LITELLM_ENV = {"LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False",
               "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true"}
# The targets each process serves, and the API each target speaks (chat unless named here).
PROCESSES = {"rlproxy-batch": ["rlproxy-batch", "rlproxy-responses", "rlproxy-messages"],
             "rlproxy-spool": ["rlproxy-spool"], "rlproxy-sync": ["rlproxy-sync"], "litellm": ["litellm"], "agentlightning": ["agentlightning"],
             "rllm-gateway": ["rllm-gateway"]}
APIS = {"rlproxy-responses": "responses", "rlproxy-messages": "messages"}
MODES = {"rlproxy-spool": "spool", "rlproxy-sync": "sync"}  # against rlproxy-batch
TARGET_NAMES = ["stub"] + [name for names in PROCESSES.values() for name in names]


@dataclass
class Target:
    name: str
    url: str  # the URL of its API's route
    stored: Callable[[], int] | None = None  # calls it has recorded, once it has settled
    settle: Callable[[], None] = lambda: None
    headers: dict[str, str] = field(default_factory=dict)  # sent with every request
    api: str = "chat"  # the wire format it speaks: "chat", "responses" or "messages"
    process: psutil.Process | None = None  # the process that serves it, whose CPU time is measured
    acknowledged: int = 0
    errors: int = 0
    notes: list[str] = field(default_factory=list)


async def load(target: Target, concurrency: int, seconds: float, stream: bool) -> tuple[list[float], float, float]:
    """`concurrency` clients sending back to back for `seconds`; failures are counted, not raised. Returns the
    latencies, the calls per second and the CPU seconds the target's process used meanwhile."""
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=60)

    async def call(session: aiohttp.ClientSession) -> float | None:
        try:
            latency = await one(session, target.url, stream, target.api)
        except (aiohttp.ClientError, asyncio.TimeoutError, RuntimeError):
            target.errors += 1
            return None
        target.acknowledged += 1
        return latency

    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=target.headers) as session:
        await asyncio.gather(*(call(session) for _ in range(min(concurrency, 8))))  # warm the connections
        deadline = time.perf_counter() + seconds
        began, cpu = time.perf_counter(), cpu_seconds(target.process)

        async def worker() -> None:
            while time.perf_counter() < deadline:
                if (latency := await call(session)) is not None:
                    latencies.append(latency)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed, cpu = time.perf_counter() - began, cpu_seconds(target.process) - cpu
    return latencies, len(latencies) / elapsed, cpu


async def measure(targets: list[Target], levels: list[int], seconds: float, rounds: int) -> list[dict]:
    """Every target for `seconds` per cell, in `rounds` rounds of `seconds / rounds`: interleaved, so drift
    affects every target alike, and in an order that rotates, so no target always follows the same one. A row
    holds the pooled p50/p99, each round's p50 (`round_p50`, in round order) and the CPU its process spent per
    call (`cpu_us`: user+sys over the measured windows, divided by their calls; None without a process)."""
    rows = []
    for stream in (False, True):
        for level in levels:
            latencies: dict[str, list[float]] = {t.name: [] for t in targets}
            rates: dict[str, list[float]] = {t.name: [] for t in targets}
            round_p50: dict[str, list[float]] = {t.name: [] for t in targets}
            cpu: dict[str, float] = {t.name: 0.0 for t in targets}
            for number in range(rounds):
                shift = number % len(targets)
                for target in targets[shift:] + targets[:shift]:
                    got, rate, spent = await load(target, level, seconds / rounds, stream)
                    cpu[target.name] += spent
                    latencies[target.name] += got
                    rates[target.name].append(rate)
                    round_p50[target.name].append(pct(got, 50) * 1000 if got else float("nan"))
            for target in targets:
                got = latencies[target.name]
                rows.append({"target": target.name, "stream": stream, "concurrency": level,
                             "rps": sum(rates[target.name]) / rounds,
                             "p50": pct(got, 50) * 1000 if got else float("nan"),
                             "p99": pct(got, 99) * 1000 if got else float("nan"),
                             "round_p50": round_p50[target.name],
                             "cpu_us": cpu[target.name] / len(got) * 1e6 if target.process and got else None})
            print(f"  measured {'stream' if stream else 'json'} x{level}", file=sys.stderr, flush=True)
    return rows


def libpq(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


@contextlib.contextmanager
def rlproxy_targets(stub: str, server_url: str, durability: str, workdir: Path, names: list[str]):
    """One `rlproxy serve` process and a target per name, each speaking its API to that process; the calls each
    target stored are those of its route (the calls' `route` column: "chat", "responses" or "messages")."""
    with fresh_database(libpq(server_url), prefix="rlproxy_bench") as database_url:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        args = proxy_command(port, [stub], database_url, "--no-migrate", "--durability", durability,
                             "--spool-path", str(workdir / f"{durability}-spool.jsonl"))
        with running(args, url + "/readyz", log_path=workdir / f"rlproxy-{durability}.log") as process:
            settled: list[bool] = []

            def settle() -> None:  # wait for the writer to catch up; once for all the process's targets
                if settled:
                    return
                settled.append(True)
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    ready = requests.get(url + "/readyz", timeout=10).json()
                    if not ready["spool"]["pending"] and not _metric(url, "rlproxy_capture_queue_depth"):
                        break
                    time.sleep(0.5)
                time.sleep(1.0)  # the batch in the writer's hands
                fsyncs = _metric(url, "rlproxy_capture_spool_fsync_calls_count")
                calls = _metric(url, "rlproxy_capture_spool_fsync_calls_sum")
                if fsyncs:
                    shared = f" (one process: {', '.join(names)})" if len(names) > 1 else ""
                    targets[0].notes.append(f"{calls:.0f} calls made durable by {fsyncs:.0f} fsyncs "
                                            f"({calls / fsyncs:.1f} calls per fsync){shared}")

            def counter(route: str) -> Callable[[], int]:
                def stored() -> int:
                    with psycopg.connect(libpq(database_url)) as conn:
                        query = "SELECT count(*) FROM calls WHERE route = %s"
                        return conn.execute(query, (route,)).fetchone()[0]
                return stored

            apis = [APIS.get(name, "chat") for name in names]
            targets = [Target(name, url + PATHS[api], counter(api), settle, api=api,
                              process=psutil.Process(process.pid)) for name, api in zip(names, apis)]
            yield targets


def _metric(url: str, name: str) -> float:
    for line in requests.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def venv(name: str, requirement: str, probe: str) -> Path:
    """A virtualenv of its own for a third-party proxy, installed once."""
    root = VENVS / name
    python = root / "bin" / "python"
    if python.exists() and subprocess.run([python, "-c", probe], capture_output=True).returncode == 0:
        return root
    print(f"  installing {requirement} into {root} (once; a few minutes)", file=sys.stderr, flush=True)
    VENVS.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    result = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                             requirement], capture_output=True, text=True)
    if result.returncode != 0 or subprocess.run([python, "-c", probe], capture_output=True).returncode != 0:
        raise RuntimeError(f"pip install {requirement} failed: {result.stderr.strip()[-500:]}")
    return root


@contextlib.contextmanager
def litellm_target(stub: str, workdir: Path):
    root = venv("litellm", "litellm[proxy]", "import litellm.proxy.proxy_server")
    config = workdir / "litellm.yaml"
    config.write_text(textwrap.dedent(f"""\
        model_list:
          - model_name: stub-model
            litellm_params:
              model: openai/stub-model
              api_base: {stub}/v1
              api_key: unused
        litellm_settings:
          num_retries: 0
          telemetry: false
          drop_params: true
        """))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    os.environ.pop("DATABASE_URL", None)  # LiteLLM runs without a database here
    env = LITELLM_ENV
    args = [str(root / "bin" / "litellm"), "--config", str(config), "--host", "127.0.0.1",
            "--port", str(port), "--num_workers", "1"]
    with running(args, url + "/health/liveliness", env=env, timeout=180, log_path=workdir / "litellm.log") as process:
        target = Target("litellm", url + "/v1/chat/completions", process=psutil.Process(process.pid))
        target.notes.append("no database: calls are not stored")
        yield target


AGENTLIGHTNING_LAUNCHER = """
import asyncio, sys
from agentlightning import InMemoryLightningStore, LightningStoreThreaded, LLMProxy

async def main(port, upstream, out):
    store = LightningStoreThreaded(InMemoryLightningStore())  # the proxy runs in a thread of its own
    rollout = await store.start_rollout(input={"task": "bench"})
    model = {"model": "hosted_vllm/stub-model", "api_base": upstream + "/v1", "api_key": "unused"}
    proxy = LLMProxy(port=port, store=store, launch_mode="thread",
                     model_list=[{"model_name": "stub-model", "litellm_params": model}])
    await proxy.start()
    open(out, "w").write(f"/rollout/{rollout.rollout_id}/attempt/{rollout.attempt.attempt_id}")
    await asyncio.Event().wait()

asyncio.run(main(int(sys.argv[1]), sys.argv[2], sys.argv[3]))
"""


@contextlib.contextmanager
def agentlightning_target(stub: str, workdir: Path):
    root = venv("agentlightning", "agentlightning", "import agentlightning")
    launcher = workdir / "agentlightning_proxy.py"
    launcher.write_text(AGENTLIGHTNING_LAUNCHER)
    prefix_file = workdir / "agentlightning-prefix"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [str(root / "bin" / "python"), str(launcher), str(port), stub, str(prefix_file)]
    with running(args, url + "/health/liveliness", env=LITELLM_ENV, timeout=180,
                 log_path=workdir / "agentlightning.log") as process:
        deadline = time.monotonic() + 30
        while not prefix_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        target = Target("agentlightning", url + prefix_file.read_text() + "/v1/chat/completions",
                        process=psutil.Process(process.pid))
        target.notes.append("LiteLLM proxy + rollout middleware + token-id and OpenTelemetry callbacks, "
                            "in-memory store; streams are converted to non-streaming upstream by default")
        yield target


@contextlib.contextmanager
def rllm_target(stub: str, workdir: Path):
    root = venv("rllm-model-gateway", "rllm-model-gateway", "import rllm_model_gateway")
    database = workdir / "rllm-traces.db"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [str(root / "bin" / "rllm-model-gateway"), "--host", "127.0.0.1", "--port", str(port), "--worker",
            f"{stub}/v1", "--db-path", str(database), "--log-level", "warning"]
    with running(args, url + "/health", timeout=120, log_path=workdir / "rllm-gateway.log") as process:
        def settle() -> None:
            requests.post(url + "/admin/flush", timeout=30)

        def stored() -> int:
            with contextlib.closing(sqlite3.connect(database)) as conn:
                return conn.execute("SELECT count(*) FROM traces").fetchone()[0]

        yield Target("rllm-gateway", url + "/sessions/bench/v1/chat/completions", stored, settle,
                     notes=["records traces into SQLite"], process=psutil.Process(process.pid))


def print_table(rows: list[dict], targets: list[Target]) -> None:
    cell = {(r["target"], r["stream"], r["concurrency"]): r for r in rows}
    names = [t.name for t in targets]
    for stream in (False, True):
        kind = "streaming" if stream else "non-streaming"
        print(f"\n{kind} (added latency: p50/p99 minus the stub's)")
        print(f"{'target':<18}{'conc':>5}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'+p50 ms':>9}{'+p99 ms':>9}"
              f"{'req/s vs LiteLLM':>18}{'CPU us/call':>13}")
        for level in sorted({r["concurrency"] for r in rows}):
            stub = cell.get(("stub", stream, level))
            litellm = cell.get(("litellm", stream, level))
            for name in names:
                row = cell.get((name, stream, level))
                if row is None:
                    continue
                added = ("", "") if stub is None or name == "stub" else (
                    f"{row['p50'] - stub['p50']:.1f}", f"{row['p99'] - stub['p99']:.1f}")
                ratio = f"{row['rps'] / litellm['rps']:.2f}" if litellm and litellm["rps"] else ""
                cpu = f"{row['cpu_us']:.0f}" if row.get("cpu_us") is not None else ""
                print(f"{name:<18}{level:>5}{row['rps']:>9.0f}{row['p50']:>9.1f}{row['p99']:>9.1f}"
                      f"{added[0]:>9}{added[1]:>9}{ratio:>18}{cpu:>13}")
            print()
        print_wire_formats(cell, stream, APIS)
        print_wire_formats(cell, stream, MODES, title="durability: p50 minus rlproxy-batch's")


def print_losses(targets: list[Target]) -> None:
    print("\ncalls: acknowledged (HTTP 200, whole body read), errors, stored, lost (acknowledged - stored)")
    for target in targets:
        line = f"  {target.name:<18} acknowledged={target.acknowledged} errors={target.errors}"
        if target.stored is not None:
            target.settle()
            stored = target.stored()
            line += f" stored={stored} lost={max(0, target.acknowledged - stored)}"
        else:
            line += " stored=n/a"
        print(line + "".join(f"\n      {note}" for note in target.notes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default="postgresql+asyncpg://postgres@127.0.0.1:5432/test",
                        help="A Postgres server (any database on it) to create the bench databases on.")
    parser.add_argument("--seconds", type=float, default=3.0, help="Seconds of load per cell and target.")
    parser.add_argument("--rounds", type=int, default=5,
                        help="Interleaved rounds each cell is split into (the wire-format differences' noise).")
    parser.add_argument("--levels", default="1,16,64,256")
    parser.add_argument("--only", default=",".join(TARGET_NAMES), help="Targets to run (stub always runs).")
    parser.add_argument("--quick", action="store_true",
                        help="A smoke run: 1 and 16 clients, 1 s per cell in 2 rounds (the figures are noise).")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.rounds, args.levels = 1.0, 2, "1,16"
    levels = [int(x) for x in args.levels.split(",")]
    wanted = set(args.only.split(",")) | {"stub"}
    workdir = Path(tempfile.mkdtemp(prefix="rlproxy-load-"))
    stub_port = free_port()
    stub = f"http://127.0.0.1:{stub_port}"
    starters = {  # each a process, yielding its targets among `names`
        "rlproxy-batch": lambda names: rlproxy_targets(stub, args.database_url, "batch", workdir, names),
        "rlproxy-spool": lambda names: rlproxy_targets(stub, args.database_url, "spool", workdir, names),
        "rlproxy-sync": lambda names: rlproxy_targets(stub, args.database_url, "sync", workdir, names),
        "litellm": lambda names: litellm_target(stub, workdir),
        "agentlightning": lambda names: agentlightning_target(stub, workdir),
        "rllm-gateway": lambda names: rllm_target(stub, workdir),
    }
    with contextlib.ExitStack() as stack:
        engine = stack.enter_context(running(stub_command(stub_port), stub + "/health", log_path=workdir / "stub.log"))
        targets = [Target("stub", stub + "/v1/chat/completions", process=psutil.Process(engine.pid))]
        for process, served in PROCESSES.items():
            names = [name for name in served if name in wanted]
            if not names:
                continue
            try:
                started = stack.enter_context(starters[process](names))
            except Exception as exc:  # noqa: BLE001 — one target failing must not stop the others
                print(f"  {', '.join(names)} skipped: {exc}", file=sys.stderr, flush=True)
                continue
            for target in started if isinstance(started, list) else [started]:
                asyncio.run(load(target, 1, 0.2, False))  # it answers at all?
                if target.acknowledged:
                    targets.append(target)
                    print(f"  {target.name} ready", file=sys.stderr, flush=True)
                else:
                    print(f"  {target.name} skipped: no successful call (see {workdir})", file=sys.stderr,
                          flush=True)
        described = machine()
        rows = asyncio.run(measure(targets, levels, args.seconds, args.rounds))
        print(described)
        print(f"\nload: {args.seconds:g} s per cell and target in {args.rounds} interleaved rounds; logs in {workdir}")
        print_table(rows, targets)
        print_cpu_budget(rows, targets)
        print_losses(targets)


if __name__ == "__main__":
    main()
