"""Start-up in words: the checks made before anything starts (ports, memory), what the engine's start is
waiting for (read off the lines it prints), and one clear line for each way the demo can fail."""
from __future__ import annotations

import asyncio
import contextlib
import errno
import re
from pathlib import Path

from core.errors import RlproxyError
from core.settings import EngineSettings
from engine.local import Engine, EngineError, port_free

# Lines vLLM 0.32 prints as its start-up moves on, and what it waits for from then on (in order; seen on
# 2 cores: importing takes most of the time, three processes each import vLLM).
ENGINE_PHASES = (
    ("", "Python to import vLLM"),
    ("non-default args", "vLLM to read the model's configuration"),
    ("Initializing a V1 LLM engine", "the engine-core process to start (it imports vLLM too)"),
    ("Starting to load model", "the weights to load"),
    ("KV cache", "the KV cache to be allocated and the model warmed up"),
    ("Starting vLLM server on", "the HTTP server to open"),
)
ENGINE_EXPECTED_SECONDS = (30.0, 90.0)
# Memory, GiB: vLLM's processes take 3.9-4.3 GB with a 1 GiB KV cache (engine/local.py), so about 3 plus
# the cache; the trainer (the model in float32, LoRA, optimizer, a batch) about 2.
ENGINE_GIB_WITHOUT_CACHE = 3.0
TRAINER_GIB = 2.0
_MEMORY_WORDS = re.compile(r"out of memory|OutOfMemory|MemoryError|Cannot allocate memory|oom", re.IGNORECASE)
_ERROR_LINE = re.compile(r"\b\w*(Error|Exception)\b")


class StartupError(RlproxyError, RuntimeError):
    """The demo cannot start as asked; the message is the one line shown to the user."""


class EnginePhase:
    """The furthest phase the engine's lines have reached (its log tail is a window: markers scroll out)."""

    def __init__(self) -> None:
        self.index = 0

    def update(self, lines: list[str]) -> str:
        for line in lines:
            for i, (marker, _) in enumerate(ENGINE_PHASES):
                if i > self.index and marker in line:
                    self.index = i
        return ENGINE_PHASES[self.index][1]


@contextlib.asynccontextmanager
async def engine_phases(engine: Engine, report):
    """While the engine starts, tell `report` what it waits for."""
    async def follow() -> None:
        phase = EnginePhase()
        while engine.ready_at is None:
            report.waiting_for(phase.update(engine.log_tail(200)))
            await asyncio.sleep(1.0)

    task = asyncio.create_task(follow())
    try:
        yield
    finally:
        task.cancel()


async def engine_alive(engine: Engine, stop: asyncio.Event) -> None:
    """Ends the run with an EngineError if the engine dies while serving (the agents' calls would only fail)."""
    while not stop.is_set():
        if not engine.running and not stop.is_set():
            raise EngineError(f"the engine exited with code {engine.returncode} while serving",
                              log_tail=engine.log_tail(), returncode=engine.returncode)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 2.0)


def available_gib() -> float | None:
    """MemAvailable from /proc/meminfo (Linux), GiB; None where it cannot be read."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_warning(kv_cache_gib: float | None, available: float | None = None) -> str | None:
    """A warning when less memory is free than the demo needs (`kv_cache_gib` None: no engine of its own)."""
    available = available_gib() if available is None else available
    need = TRAINER_GIB + (0.0 if kv_cache_gib is None else ENGINE_GIB_WITHOUT_CACHE + kv_cache_gib)
    if available is None or available >= need:
        return None
    return (f"only {available:.1f} GiB of memory is free and the demo needs about {need:.0f} GiB: "
            "the engine or the trainer may be killed")


def preflight(proxy_port: int, engine: EngineSettings | None) -> list[str]:
    """Before anything starts: raises StartupError when a port is taken; returns warnings (memory).
    `engine`: the settings of the engine the demo will start, None when it uses a running one."""
    check_ports(proxy_port, engine.port if engine else None)
    short = memory_warning(engine.kv_cache_gib if engine else None)
    return [short] if short else []


def check_ports(proxy_port: int, engine_port: int | None) -> None:
    """Refuse at once, not after a minute of engine start-up, when a port the demo needs is taken."""
    for port, flag, what in ((engine_port, "--engine-port", "the engine"), (proxy_port, "--port", "the proxy")):
        if port is not None and not port_free("127.0.0.1", port):
            raise StartupError(f"port {port} is in use, so {what} cannot listen there: stop what runs there, "
                               f"or choose another port with {flag}")


def explain(exc: BaseException, rlproxy_log: Path, engine_log: Path | None) -> str:
    """One line for a failure, with the log that has the details."""
    if isinstance(exc, StartupError):
        return str(exc)
    if isinstance(exc, EngineError):
        where = f" (the engine's output: {engine_log})" if engine_log else f" (details: {rlproxy_log})"
        first = str(exc).splitlines()[0]
        tail = exc.log_tail
        if "is in use" in first:
            return f"{first}: stop what runs there, or choose another port with --engine-port"
        if exc.returncode in (-9, 137) or any(_MEMORY_WORDS.search(line) for line in tail):
            return f"the engine ran out of memory ({first}); free some memory or lower the KV cache{where}"
        cause = next((line.strip() for line in reversed(tail) if _ERROR_LINE.search(line)), "")
        return f"the engine failed: {first}" + (f"; last error: {cause[:160]}" if cause else "") + where
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return f"a port the demo needs is in use ({exc.strerror}): choose another with --port{_details(rlproxy_log)}"
    return f"rlproxy demo stopped: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}" \
           f"{_details(rlproxy_log)}"


def _details(rlproxy_log: Path) -> str:
    return f" (details: {rlproxy_log})"
