"""Where a recorded call's CPU goes: `rlproxy serve --durability spool` (the default) in front of the stub engine,
recording into Postgres, under the load of bench/load.py at each concurrency level, sampled by py-spy while the
load runs. Prints, per level, the proxy's CPU per call (psutil: user+sys of the proxy process over the sampled
window, divided by the calls answered in it), the functions with the most self time (the sampled frame on top of
the stack; time inside a C extension such as orjson counts to the Python function that called it) and each stage
of the recording path with its share and its microseconds per call:

    exclusive   every sample goes to the innermost frame that belongs to a stage (the shares add up to 100%)
    inclusive   every sample counts for each stage it passes through (the serving stage holds the handler)

Only samples of a thread holding the GIL are taken (`--gil`): the event loop working, not waiting in epoll (with
uvloop the wait is in C under `run_app`, which py-spy's idle test alone does not leave out). A thread descheduled
while it holds the GIL is still sampled, so on a shared machine the microseconds move with the machine's load; the
shares much less. `--native` adds C frames (uvloop, the socket calls) but pauses the process for every sample.

    python bench/profile_recording.py [--levels 1,16] [--seconds 8] [--prompt-bytes 0,42000] [--quick]
                                      [--database-url postgresql+asyncpg://postgres@127.0.0.1:5432/test]
Needs py-spy (the `test` extra) and permission to trace a process (root, or ptrace_scope 0).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp
import orjson
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.cpu_budget import machine  # noqa: E402
from testkit.processes import free_port, fresh_database, proxy_command, running, stub_command  # noqa: E402

MESSAGES = [{"role": "user", "content": "What is 6 times 7?"}]

# (stage, where its frames are: a path prefix, optionally `:function`), the first match wins for a frame. Third-party
# frames that are no stage of their own (pydantic, orjson's callers) are skipped, so their time counts to the
# project's frame that called them.
STAGES: list[tuple[str, tuple[str, ...]]] = [
    ("edge middleware", ("proxy/edge/", "proxy/checks.py", "proxy/context.py")),
    ("strict JSON read", ("proxy/strict_json.py", "proxy/schemas.py:parse_json_object", "core/checks.py")),
    ("boundary: field checks", ("proxy/boundary.py", "proxy/dialects/fields.py", "proxy/dialects/checks.py",
                                "proxy/schemas.py", "proxy/dialects/:validate")),
    ("tenancy, routing, sampling", ("proxy/tenancy.py", "proxy/policy/", "core/rollout_sampling.py")),
    ("capture", ("proxy/capture.py", "proxy/token_text.py", "proxy/dialects/")),
    ("writer", ("proxy/recording/writer.py", "proxy/recording/transactions.py", "proxy/recording/spooling.py",
                "proxy/recording/replay.py", "proxy/recording/supervisor.py", "proxy/recording/identity.py",
                "proxy/recording/rejected.py", "proxy/recording/redact.py")),
    ("spool", ("proxy/recording/spool.py", "proxy/recording/lines.py", "proxy/recording/space.py")),
    ("store (Postgres)", ("store/", "sqlalchemy/", "asyncpg/")),
    ("metrics", ("proxy/metrics.py", "prometheus_client/")),
    ("logging", ("logging/",)),
    ("serving (the handler)", ("proxy/serving.py", "proxy/routes/", "proxy/errors.py")),
    ("engine client", ("proxy/upstream.py", "aiohttp/client", "aiohttp/connector.py", "aiohttp/streams.py",
                       "aiohttp/client_proto.py", "aiohttp/client_reqrep.py", "yarl/", "multidict/")),
    ("HTTP server (aiohttp)", ("aiohttp/",)),
    ("event loop (asyncio)", ("asyncio/", "selectors.py", "threading.py", "concurrent/")),
]
PROJECT = ("proxy/", "store/", "core/")
ENTRY = {"run", "serve", "main"}  # the process's own frames, under everything
FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def stage_of(file: str, function: str) -> str | None:
    for stage, places in STAGES:
        for place in places:
            path, _, name = place.partition(":")
            if (file.startswith(path) or f"/{path}" in file) and (
                    not name or function == name or function.endswith("." + name)):
                return stage
    return None


def parse_raw(text: str) -> list[tuple[list[tuple[str, str]], int]]:
    """py-spy's raw (collapsed) output: one stack a line, outermost frame first, then its sample count."""
    stacks = []
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = []
        for frame in stack.split(";"):
            match = FRAME.match(frame.strip())
            frames.append((match["file"], match["function"]) if match else ("", frame.strip()))
        stacks.append((frames, int(count)))
    return stacks


def summarise(stacks: list[tuple[list[tuple[str, str]], int]]) -> dict:
    total = sum(count for _, count in stacks) or 1
    self_time: collections.Counter = collections.Counter()
    exclusive: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    cumulative: collections.Counter = collections.Counter()  # the project's functions, with what they call
    for frames, count in stacks:
        file, function = frames[-1]
        self_time[f"{function} ({file})"] += count
        for file_, function_ in set(frames):
            if file_.startswith(PROJECT) and function_ not in ENTRY:
                cumulative[f"{function_} ({file_})"] += count
        stages = [stage_of(file, function) for file, function in frames]
        exclusive[next((s for s in reversed(stages) if s), "other")] += count
        for stage in set(stages):
            inclusive[stage or "other"] += count
    return {"total": total, "self": self_time, "exclusive": exclusive, "inclusive": inclusive,
            "cumulative": cumulative}


def body(prompt_bytes: int) -> bytes:
    """The bench's chat call; with `prompt_bytes`, an agent's history of about that size before the question."""
    messages = list(MESSAGES)
    turn = "The tool returned: " + "lorem ipsum dolor sit amet, " * 36  # ~1 KB a turn
    while prompt_bytes > 0 and len(orjson.dumps(messages)) < prompt_bytes:
        messages[-1:-1] = [{"role": "user", "content": turn}, {"role": "assistant", "content": turn[::-1]}]
    return orjson.dumps({"model": "stub-model", "messages": messages, "max_tokens": 8})


async def load(url: str, data: bytes, concurrency: int, seconds: float) -> int:
    """`concurrency` clients back to back for `seconds`; the calls answered with 200."""
    done = 0
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                async with session.post(url, data=data, headers=headers) as response:
                    await response.read()
                    done += response.status == 200

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done


def profile(pid: int, url: str, data: bytes, level: int, seconds: float, rate: int, out: Path,
            native: bool = False) -> dict:
    """Load at `level` for `seconds` while py-spy samples the proxy; its summary with the CPU per call."""
    asyncio.run(load(url, data, level, 1.0))  # warm
    process = psutil.Process(pid)
    spy = subprocess.Popen([shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy"), "record",
                            "--pid", str(pid), "--format", "raw", "--rate", str(rate), "--output", str(out),
                            "--gil", *(["--native"] if native else ["--nonblocking"])], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)  # py-spy attached
    batches = _metric(url, "rlproxy_capture_batch_size")
    before = process.cpu_times()
    began = time.perf_counter()
    calls = asyncio.run(load(url, data, level, seconds))
    elapsed = time.perf_counter() - began
    after = process.cpu_times()
    batches = [b - a for a, b in zip(batches, _metric(url, "rlproxy_capture_batch_size"))]
    spy.send_signal(2)  # SIGINT: py-spy writes what it has
    _, err = spy.communicate(timeout=60)
    if not out.exists():
        raise RuntimeError(f"py-spy wrote nothing: {err.decode(errors='replace')[-500:]}")
    summary = summarise(parse_raw(out.read_text()))
    cpu = (after.user - before.user) + (after.system - before.system)
    summary.update(level=level, calls=calls, rps=calls / elapsed, cpu_per_call_us=cpu / max(calls, 1) * 1e6,
                   cpu_share=cpu / elapsed, batch=batches[0] / batches[1] if batches[1] else 0.0)
    return summary


def _metric(url: str, histogram: str) -> tuple[float, float]:
    """A histogram's (sum, count) from the proxy's /metrics."""
    found = {}
    with urllib.request.urlopen(url.rsplit("/v1/", 1)[0] + "/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            name, _, value = line.partition(" ")
            if name in (histogram + "_sum", histogram + "_count"):
                found[name] = float(value)
    return found.get(histogram + "_sum", 0.0), found.get(histogram + "_count", 0.0)


def report(summary: dict, top: int, prompt: int) -> str:
    total, per_call = summary["total"], summary["cpu_per_call_us"]
    lines = [f"\n== {summary['level']} client(s), body {prompt} bytes: {summary['rps']:.0f} calls/s, proxy CPU "
             f"{per_call:.0f} us per call ({summary['cpu_share']:.2f} cores busy), {summary['batch']:.1f} calls per write "
             f"transaction, {total} samples",
             f"{'stage':<30}{'exclusive':>10}{'us/call':>9}{'inclusive':>11}{'us/call':>9}"]
    for stage in [s for s, _ in STAGES] + ["other"]:
        ex, inc = summary["exclusive"][stage] / total, summary["inclusive"][stage] / total
        if ex or inc:
            lines.append(f"{stage:<30}{ex:>9.1%}{ex * per_call:>9.0f}{inc:>10.1%}{inc * per_call:>9.0f}")
    lines.append(f"\ntop {top} functions by self time (share of samples, us per call)")
    for name, count in summary["self"].most_common(top):
        lines.append(f"{count / total:>7.1%}{count / total * per_call:>7.0f} us  {name}")
    lines.append(f"\ntop {top} of the project's functions by cumulative time (with what they call)")
    for name, count in summary["cumulative"].most_common(top):
        lines.append(f"{count / total:>7.1%}{count / total * per_call:>7.0f} us  {name}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default="postgresql+asyncpg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--levels", default="1,16")
    parser.add_argument("--seconds", type=float, default=8.0, help="Sampled seconds of load per level.")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second.")
    parser.add_argument("--prompt-bytes", default="0",
                        help="Bodies to send, one profile each: histories of about these many bytes, comma-separated "
                             "(0: the bench's one-line question).")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--durability", default="spool", choices=("spool", "batch", "sync"))
    parser.add_argument("--native", action="store_true",
                        help="Also sample C frames (uvloop, orjson, the socket calls): slower to sample.")
    parser.add_argument("--quick", action="store_true", help="2 s per level at 100 samples/s (a smoke run).")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.rate = 2.0, 100
    workdir = Path(tempfile.mkdtemp(prefix="rlproxy-profile-"))
    print(machine())
    stub_port, port = free_port(), free_port()
    stub, url = f"http://127.0.0.1:{stub_port}", f"http://127.0.0.1:{port}"
    server = args.database_url.replace("postgresql+asyncpg://", "postgresql://", 1)
    with running(stub_command(stub_port), stub + "/health", log_path=workdir / "stub.log"), \
            fresh_database(server, prefix="rlproxy_profile") as database_url, \
            running(proxy_command(port, [stub], database_url, "--no-migrate", "--durability", args.durability,
                                  "--spool-path", str(workdir / "spool.jsonl")), url + "/readyz",
                    log_path=workdir / "proxy.log") as proxy:
        print(f"profile of rlproxy serve --durability {args.durability} (pid {proxy.pid}): {args.seconds:g} s a "
              f"level at {args.rate} samples/s; raw stacks in {workdir}")
        for size in (int(x) for x in args.prompt_bytes.split(",")):
            data = body(size)
            for level in (int(x) for x in args.levels.split(",")):
                summary = profile(proxy.pid, url + "/v1/chat/completions", data, level, args.seconds, args.rate,
                                  workdir / f"stacks-{size}-{level}.txt", args.native)
                print(report(summary, args.top, len(data)), flush=True)


if __name__ == "__main__":
    main()
