"""Start and supervise a local vLLM engine (OpenAI-compatible server) as a child process.

    with Engine(EngineSettings(port=8000)) as engine:      # or: async with Engine(...) as engine
        requests.get(engine.base_url + "/v1/models")

The engine runs ``python -m vllm.entrypoints.openai.api_server`` with the interpreter running us, on
loopback, with runtime LoRA loading (its routes are used by engine/adapters.py alone), the tool-call and
reasoning parsers of the model's family (engine/families.py) and a seed. `engine_command` builds the command line, `engine_env` its environment.

The engine never outlives us. It runs in its own process group (setsid), led by a small guard
process (`GUARD_SCRIPT`, plain Python, no imports of ours) whose child is vLLM. `Engine.stop` sends
SIGTERM to the group and SIGKILL after a grace period. If we die, even by SIGKILL, the kernel sends the
guard SIGTERM (Linux ``PR_SET_PDEATHSIG``; the guard also notices its parent pid change), and the guard
stops the whole group the same way. The guard is needed because vLLM does not pass a SIGTERM received
during its start-up on to its engine-core process, which then waits for its worker forever. The death
signal fires when the *thread* that forked the child ends, so children are always forked from one
long-lived helper thread, whatever thread calls `Engine.start`.

How the command line and environment are made, and why: engine/command.py; the guard: engine/guard.py.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from core.hardware import visible_gpus
from core.settings import EngineSettings
from engine.command import (
    DEFAULT_DTYPE,
    DEFAULT_SEED,
    EngineError,
    connect_host,
    engine_command,
    engine_env,
    family_plan,
    lora_rank_slot,
    port_free,
    served_name,
    vllm_available,
)
from engine.guard import GUARD_SCRIPT, group_members, killpg, set_parent_death_signal, spawn
from engine.model import default_model_path

# Imported from here by the CLI, the demo and the tests: the engine's names in one place.
__all__ = ["DEFAULT_DTYPE", "DEFAULT_SEED", "Engine", "EngineError", "connect_host", "engine_command", "engine_env",
           "group_members", "lora_rank_slot", "port_free", "served_name", "vllm_available"]

log = logging.getLogger(__name__)

engine_log = logging.getLogger("engine.local.vllm")

DEFAULT_GRACE_PERIOD = 20.0
LOG_PREFIX = "[engine] "
_LOG_TAIL = 200

# vLLM's own lines look like "(APIServer pid=8758) WARNING 11-22 02:49:33 [file.py:12] text".
_CAST_NOTICE = "Attempted to load weight"
_LEVEL_RE = re.compile(r"^(?:\([^)]*\) )?(DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d ")



class Engine:
    """A vLLM server child process for `settings`, started on `start()` / `with` / `async with`.

    `base_url` is ``http://host:port`` (no ``/v1``). `wait_ready()` / `await wait_ready_async()` poll
    ``/v1/models`` until it answers with the served name, raising `EngineError` with the last log lines
    if the process dies or `settings.startup_timeout` passes. `stop()` sends SIGTERM to the process group,
    then SIGKILL after `grace_period` seconds. Log lines go to the ``engine.local.vllm`` logger with
    `log_prefix`, or straight to stderr when logging is not configured.
    """

    def __init__(
        self,
        settings: EngineSettings | None = None,
        *,
        model_path: Path | None = None,
        dtype: str | None = DEFAULT_DTYPE,  # None: auto on GPUs, float32 on a CPU (engine/command.py)
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
            self._model_path = default_model_path()
        return self._model_path

    @property
    def served_model_name(self) -> str:
        return served_name(self.settings, self.model_path)

    @property
    def auth_headers(self) -> dict[str, str]:
        """What a client of this engine sends (its key, when it requires one)."""
        key = self.settings.engine_key
        return {"Authorization": f"Bearer {key.get_secret_value()}"} if key is not None else {}

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
        # the GPUs the engine's own environment shows (CUDA_VISIBLE_DEVICES there picks its devices and dtype)
        return engine_command(self.settings, self.model_path, dtype=self.dtype, seed=self.seed,
                              gpus=visible_gpus(self._env))

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
        plan = family_plan(self.settings, self.model_path)
        for name, value in plan.env:  # what the family needs (gpt-oss: its harmony vocabulary), unless set
            env.setdefault(name, value)
        log.info("starting engine: %s", " ".join(cmd))
        log.info("%s", plan.describe())
        guarded = [cmd[0], "-c", GUARD_SCRIPT, str(self.grace_period), *cmd]
        parent = os.getpid()
        try:
            self._proc = spawn(
                guarded,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # setsid: its own process group, away from our terminal
                preexec_fn=functools.partial(set_parent_death_signal, parent),
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
        request = urllib.request.Request(self.base_url + "/v1/models", headers=self.auth_headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
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
            killpg(pgid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                log.warning("engine did not stop within %.0f s of SIGTERM; killing it", grace)
                killpg(pgid, signal.SIGKILL)
                proc.wait()
        # vLLM's engine-core and worker processes may outlive the leader for a moment: wait for the
        # group to empty, SIGKILL what is still alive after the grace period.
        deadline = time.monotonic() + max(grace, 1.0)
        killed = False
        while True:
            members = group_members(pgid)
            if not members:
                break
            now = time.monotonic()
            if now >= deadline:
                if killed or all(state == "Z" for _, state in members):
                    break  # zombies only (their new parent reaps them), or SIGKILL had 5 s
                log.warning("engine processes %s outlived the grace period; killing them", members)
                killpg(pgid, signal.SIGKILL)
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

