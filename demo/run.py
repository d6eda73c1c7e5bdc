"""`rlproxy demo`: the whole loop on one machine — vLLM on CPU, the proxy (SQLite by default), the trainer,
and the bundled tool-using agent running episodes through the proxy — with live progress, held-out success
per policy version, a final table and a reward curve. Ctrl-C stops everything; the next run resumes.

Held-out success is measured one of two ways (`gate`):
  probes   a share of the agent's episodes are held-out tasks, run under another agent name that the
           trainer never trains on; each version is scored on the probes it served. New versions serve at
           once, and measuring costs no pause (the default: on CPU a full held-out pass with an adapter
           takes minutes, longer than a training step).
  heldout  every candidate is scored on the gate split before it may serve (docs/gates.md): the trainer's
           command gate runs demo/score.py; it serves only if not worse than its parent by more than
           gate_margin. Agents pause while it runs. Held-out numbers never come from the gate split."""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import secrets
import signal
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import openai
from aiohttp import web
from pydantic import SecretStr

from core.hardware import fast_bf16
from core.settings import AuthSettings, EngineSettings, ProxySettings, RunSettings, TrainerSettings, WriterSettings
from core.settings.demo import AGENT, PROBE_AGENT, DemoSettings
from demo.agent import AIR_TEXT_ACTION, AIR_TEXT_ERROR, run_episode
from demo.evaluate import HeldoutResult, evaluate_heldout
from demo.report import Report
from demo.score import command
from demo.startup import ENGINE_EXPECTED_SECONDS, engine_alive, engine_phases, preflight
from demo.tasks import Task, heldout_tasks, train_tasks
from engine.local import Engine, lora_rank_slot
from engine.model import default_model_dir, is_prepared, prepare_model
from proxy.app import build_app
from runner.agents import ClientConfig
from runner.attempt import Attempt, Outcome
from runner.run import Runner
from runner.tasks import EVAL, TRAIN
from runner.tasks import Task as RunnerTask
from store import policies, verdicts
from store.db import short_session
from trainer.gates.command import CommandGate
from trainer.worker import TrainerWorker

log = logging.getLogger("rlproxy.demo")

GATES = ("probes", "heldout")
# The runner's limit on one episode, above what one can take: each model call has the openai client's own
# timeout (10 minutes), which is what limits an episode.
EPISODE_TIMEOUT_S = 3600.0


@dataclass
class Progress:
    started: float = field(default_factory=time.monotonic)
    episodes: int = 0
    rewards: list[tuple[float, float, int]] = field(default_factory=list)  # (seconds, reward, policy)
    heldout: dict[int, float] = field(default_factory=dict)  # version -> success on a full held-out evaluation
    gate: dict[int, float] = field(default_factory=dict)  # version -> success on the gate split (gate=heldout)
    probes: list[tuple[float, float, int]] = field(default_factory=list)  # held-out probes: (seconds, reward, policy)
    active: int = 0
    steps: int = 0
    last_event: str = "starting"
    run_started: float | None = None  # when start-up was over and the agents began (the deadline counts from it)
    training_since: float | None = None  # a training step is computing (the agents wait) since then

    def recent_reward(self, n: int = 64) -> float:
        window = [r for _, r, _ in self.rewards[-n:]]
        return statistics.fmean(window) if window else 0.0

    def probe_success(self) -> dict[int, tuple[float, int]]:
        """version -> (held-out success, probes) over the probes each version served."""
        by_version: dict[int, list[float]] = {}
        for _, reward, version in self.probes:
            by_version.setdefault(version, []).append(reward)
        return {v: (statistics.fmean(rs), len(rs)) for v, rs in sorted(by_version.items())}

    def recent_probe_success(self, n: int = 32) -> tuple[float, int] | None:
        window = [r for _, r, _ in self.probes[-n:]]
        return (statistics.fmean(window), len(window)) if window else None


class Demo:
    def __init__(self, settings: DemoSettings, report: Report | None = None) -> None:
        self.settings = settings
        self.progress = Progress()
        self.report = report or Report()  # what the user sees (demo/report.py); by default only the log
        self.engine: Engine | None = None  # the engine the demo started, if it started one
        self.engine_key: SecretStr | None = None  # the key it requires (an engine given by --upstream: none)
        self.stop = asyncio.Event()
        self.agents_may_run = asyncio.Event()  # cleared while a candidate is evaluated: the engine is all its
        self.agents_may_run.set()
        self.state_path = settings.workdir / "rlproxy-demo.json"
        self.train_pool = train_tasks(512, seed=settings.task_seed)
        if settings.gate not in GATES:
            raise ValueError(f"gate must be one of {GATES}, not {settings.gate!r}")
        self.heldout_pool = heldout_tasks(settings.heldout, seed=settings.task_seed)
        self.probe_pool = heldout_tasks(1024, seed=settings.task_seed + 1)
        self.rng = random.Random(settings.task_seed)

    # --- the main sequence ------------------------------------------------------------------------------
    async def run(self) -> Progress:
        self._main = asyncio.current_task()  # what Ctrl-C during start-up cancels
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._interrupted)
        try:
            async with self.report.shown(self.progress, self.settings):
                await self._start_and_run()
        except asyncio.CancelledError:
            if not self.stop.is_set():
                raise
            log.info("stopped during start-up")  # Ctrl-C before the run began: nothing to save
            return self.progress
        self._save()
        return self.progress

    async def _start_and_run(self) -> None:
        upstream = self.settings.upstream
        # vLLM's CPU LoRA kernels gather each token's adapter weights padded to max_lora_rank: no padding.
        # 1 GiB of KV cache holds 46k tokens; the demo never has more than ~7k in flight (docs/memory.md)
        # The engine's own key: the episodes' agents run on this machine, and without it any of them could load
        # weights into the engine under the served adapter's name. Only the proxy and the trainer hold it.
        engine_settings = EngineSettings(port=self.settings.engine_port, max_model_len=2048, kv_cache_gib=1,
                                         max_loras=4, max_lora_rank=lora_rank_slot(self.settings.training.lora_rank),
                                         engine_key=SecretStr(secrets.token_urlsafe(32)))
        for warning in preflight(self.settings.proxy_port, None if upstream else engine_settings):
            log.warning(warning)  # shown as one line (demo/output.py Alerts), kept in rlproxy.log
        first = not is_prepared(default_model_dir())
        self._note("preparing the model" + (": converting the bundled GGUF (first run only)" if first else ""))
        model_path = await asyncio.to_thread(prepare_model)
        if upstream:
            self._note(f"connecting to the engine at {upstream}")
            await self._loop(upstream.rstrip("/"), await _served_model(upstream), model_path)
            return
        self._note(f"starting the engine (vLLM on port {engine_settings.port})", expected=ENGINE_EXPECTED_SECONDS)
        # bfloat16 only where the hardware does it fast (core/hardware.py has the numbers)
        dtype = "bfloat16" if fast_bf16() else "float32"
        # log_prefix "": its lines go as printed to engine.log (demo/output.py)
        self.engine = Engine(engine_settings, model_path=model_path, dtype=dtype, log_prefix="")
        self.engine_key = engine_settings.engine_key
        async with engine_phases(self.engine, self.report), self.engine as engine:
            await self._loop(engine.base_url, engine.served_model_name, model_path)
            self._note("stopping the engine")

    async def _loop(self, engine_url: str, served: str, model_path: Path) -> None:
        self._note("starting the proxy")
        runner = await self._start_proxy(engine_url, served)
        proxy = f"http://127.0.0.1:{self.settings.proxy_port}"
        try:
            await self._restore(proxy, served)
            trainer = TrainerWorker(
                TrainerSettings(database_url=self.settings.database_url, upstreams=(engine_url,),
                                upstream_api_key=self.engine_key,
                                adapters_dir=self.settings.workdir / "rlproxy-adapters", metrics_port=None,
                                worker_id="demo-trainer", training=self.settings.training),
                model_path, on_published=lambda v: self._gate(engine_url, v),
                while_computing=self._agents_paused)
            tasks = [asyncio.create_task(trainer.run(self.stop), name="trainer"),
                     asyncio.create_task(self._agents(proxy, served), name="agents"),
                     asyncio.create_task(self._deadline(), name="deadline")]
            await self._watch(tasks)
        finally:
            self.stop.set()
            await runner.cleanup()

    @contextlib.asynccontextmanager
    async def _agents_paused(self):
        """Two cores cannot serve episodes and train at once without slowing both many times over (and the
        agents' event loop starves the step of the GIL): agents wait while the trainer computes."""
        self.agents_may_run.clear()
        self.progress.training_since = time.monotonic()
        try:
            yield
        finally:
            self.progress.training_since = None
            self.agents_may_run.set()

    async def _watch(self, tasks: list[asyncio.Task]) -> None:
        self.progress.run_started = time.monotonic()
        self.report.start_run()
        self._note(f"agents running, {self.settings.concurrency} episodes at a time; training as rollouts come in")
        if self.engine is not None:
            tasks = [*tasks, asyncio.create_task(engine_alive(self.engine, self.stop), name="engine")]
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        self.stop.set()
        if pending:
            await asyncio.wait(pending, timeout=120)
        for task in done:
            if task.exception() is not None:
                raise task.exception()

    async def _deadline(self) -> None:
        try:
            await asyncio.wait_for(self.stop.wait(), self.settings.minutes * 60)
        except asyncio.TimeoutError:
            self._note("time is up: finishing the episodes in flight")
            self.stop.set()

    async def _start_proxy(self, engine_url: str, served: str) -> web.AppRunner:
        workdir = self.settings.workdir
        settings = ProxySettings(port=self.settings.proxy_port, upstreams=(engine_url,),
                                 database_url=self.settings.database_url, served_model=served,
                                 air=self.settings.air, policy_refresh_interval=0.5,
                                 # the agent's text protocol: a failed CALC/LOOKUP earns its call a tool_error
                                 air_text_action=AIR_TEXT_ACTION, air_text_error=AIR_TEXT_ERROR,
                                 writer=WriterSettings(spool_path=workdir / "rlproxy-spool.jsonl"),
                                 auth=AuthSettings(upstream_api_key=self.engine_key))
        runner = web.AppRunner(build_app(settings), handler_cancellation=True, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.settings.proxy_port).start()
        return runner

    # --- agents -------------------------------------------------------------------------------------------
    async def _agents(self, proxy: str, served: str) -> None:
        """The runner (runner/) runs the episodes, `concurrency` at a time, each a rollout rewarded with its
        episode's reward; this draws them (`_attempts`) and counts each as it ends (`_finished`). An episode
        that fails is logged and not counted, nor tried again on a new rollout (retries=0: the demo counts the
        episodes as they ran). Once stopped, no episode starts, and those in flight get a minute to finish."""

        async def episode(task: Task, config: ClientConfig) -> float:
            client = openai.AsyncOpenAI(base_url=config.openai_base_url, api_key="demo", max_retries=0)
            try:
                return (await run_episode(client, served, task)).reward
            finally:
                await client.close()

        settings = RunSettings(proxy=proxy, concurrency=self.settings.concurrency, retries=0,
                               timeout=EPISODE_TIMEOUT_S, agent_name=AGENT)
        no_more = asyncio.Event()
        async with Runner(episode, settings, on_attempt=self._finished) as runner:
            episodes = asyncio.create_task(runner.run_attempts(self._attempts(no_more)))
            waiting = asyncio.create_task(no_more.wait())
            try:
                await asyncio.wait({episodes, waiting}, return_when=asyncio.FIRST_COMPLETED)
                await asyncio.wait({episodes}, timeout=60)
            finally:
                waiting.cancel()
                if not episodes.done():
                    episodes.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await episodes
        if not episodes.cancelled():
            episodes.result()  # the proxy refused the runner: the demo stops with that error

    async def _attempts(self, no_more: asyncio.Event) -> AsyncIterator[Attempt]:
        """Groups of `group_size` episodes of one training task at a time (or, with gate=probes, now and then a
        single held-out probe: an evaluation rollout under another agent name, never trained on), each asked
        for by the runner when a place is free; none while the trainer computes; none once stopped."""
        probing = self.settings.gate == "probes" and self.settings.probe_share > 0
        # probes per training episode, drawn as whole groups: share / (1 - share) probes per episode
        group_size = self.settings.training.group_size
        probes_per_group = (self.settings.probe_share / (1 - self.settings.probe_share) * group_size
                            if probing else 0.0)
        owed, group = 0.0, 0
        try:
            while not self.stop.is_set():
                if owed >= 1.0:
                    owed -= 1.0
                    probe = self.rng.choice(self.probe_pool)
                    jobs = [Attempt(RunnerTask(probe.task_id, probe, EVAL), group, 0, PROBE_AGENT)]
                else:
                    owed += probes_per_group
                    drawn = self.rng.choice(self.train_pool)
                    jobs = [Attempt(RunnerTask(drawn.task_id, drawn, TRAIN), group, number)
                            for number in range(group_size)]
                group += 1
                await self.agents_may_run.wait()
                for job in jobs:
                    if self.stop.is_set():
                        return
                    yield job
        finally:
            no_more.set()

    def _finished(self, outcome: Outcome) -> None:
        if outcome.status != "rewarded":
            if not self.stop.is_set():
                log.warning("episode failed: %s", outcome.error or outcome.status)
            return
        seconds = time.monotonic() - self.progress.started
        if outcome.split == EVAL:  # a probe measures the version that answered its first call
            served_by = outcome.policies[0] if outcome.policies else None
            if served_by is not None:
                self.progress.probes.append((seconds, outcome.reward, served_by))
            return
        self.progress.episodes += 1
        self.progress.rewards.append((seconds, outcome.reward, self.progress.active))

    # --- the held-out gate ----------------------------------------------------------------------------------
    async def _evaluate(self, proxy: str, model: str) -> HeldoutResult:
        with self.report.counting(len(self.heldout_pool)) as tick:  # a bar over the tasks
            return await evaluate_heldout(f"{proxy}/v1", model, self.heldout_pool,
                                          concurrency=2 * self.settings.concurrency, api_key="demo",
                                          on_episode=tick)

    async def _gate(self, engine_url: str, version: int) -> bool | None:
        """With gate=heldout, serve a candidate only if its success on the gate split (demo/score.py, run by the
        trainer's command gate as any user's script would be) is not worse than its parent's by the margin;
        with gate=probes, serve it now: the evaluation rollouts it answers measure it."""
        parent = self.progress.active
        if self.settings.gate == "probes":
            self.progress.steps += 1
            self.progress.active = version
            self._note(f"v{version} serving (trained on the rollouts of v{parent}); held-out probes measure it")
            return True
        self._note(f"scoring candidate v{version} on {self.settings.heldout} tasks of the gate split")
        gate = CommandGate(TrainerSettings(
            database_url=self.settings.database_url, upstreams=(engine_url,), metrics_port=None, gate="command",
            upstream_api_key=self.engine_key,
            gate_margin=self.settings.gate_margin,
            eval_command=command(tasks=self.settings.heldout, seed=self.settings.task_seed,
                                 concurrency=2 * self.settings.concurrency)))
        self.agents_may_run.clear()
        evaluation = asyncio.create_task(gate(version))
        stopped = asyncio.create_task(self.stop.wait())
        try:
            await asyncio.wait({evaluation, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.agents_may_run.set()
            stopped.cancel()
        if not evaluation.done():  # Ctrl-C: stop now; the candidate is scored when the demo runs again
            evaluation.cancel()
            return None
        promoted = evaluation.result()
        async with short_session(self.settings.database_url) as sessions, sessions() as session:
            verdict = await verdicts.record(session, version, verdicts.COMMAND_GATE) or {}
        if verdict.get("score") is not None:
            self.progress.gate[version] = verdict["score"]
        if verdict.get("parent_score") is not None:
            self.progress.gate[parent] = verdict["parent_score"]
        self.progress.steps += 1
        if promoted:
            self.progress.active = version
        self._note(f"v{version}: gate set {_percent(verdict.get('score'))} vs v{parent} "
                   f"{_percent(verdict.get('parent_score'))} -> {'serving' if promoted else 'kept out'}")
        self._save()
        return promoted

    # --- resuming ---------------------------------------------------------------------------------------------
    async def _restore(self, proxy: str, served: str) -> None:
        if self.state_path.exists():
            saved = json.loads(self.state_path.read_text())
            self.progress.heldout = {int(k): v for k, v in saved.get("heldout", {}).items()}
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{proxy}/policies") as r:
                self.progress.active = (await r.json())["active"]
        if policies.BASE_VERSION not in self.progress.heldout:
            self._note(f"measuring the base model on {len(self.heldout_pool)} held-out tasks")
            self.progress.heldout[policies.BASE_VERSION] = (await self._evaluate(proxy, served)).success
            self._save()

    def _save(self) -> None:
        """Full held-out results (kept across runs), and this run's episodes for bench/learning.py."""
        p = self.progress
        self.state_path.write_text(json.dumps({
            "heldout": p.heldout, "heldout_tasks": self.settings.heldout, "gate_split": p.gate,
            "last_run": {"minutes": (time.monotonic() - p.started) / 60, "episodes": p.episodes,
                         "versions": p.steps, "gate": self.settings.gate,
                         "rewards": [list(r) for r in p.rewards], "probes": [list(r) for r in p.probes]},
        }, indent=1))

    def _interrupted(self) -> None:
        if not self.report.running:  # start-up (engine, base measurement): nothing to finish, stop at once
            self.stop.set()
            self._main.cancel()
            return
        if not self.stop.is_set():  # a step in progress is computed in a thread and cannot be cut short
            self._note("stopping: a training step in progress finishes first; the next run resumes from here")
        self.stop.set()

    def _note(self, message: str, **step) -> None:
        """An event: on the panel and in the log; during start-up it begins the next step (`step`: expected=
        (low, high) seconds, waiting=what it waits for)."""
        self.progress.last_event = message
        self.report.note(message, **step)
        log.info(message)


async def _served_model(engine_url: str) -> str:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{engine_url.rstrip('/')}/v1/models") as response:
            models = (await response.json())["data"]
    return next(m["id"] for m in models if not m.get("parent"))


def _percent(value: float | None) -> str:
    return "?" if value is None else f"{value:.0%}"
