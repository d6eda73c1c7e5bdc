"""The run: every (task, epoch, attempt) is one rollout, `concurrency` at a time, a task's attempts next to each
other so the trainer gets its groups early. An attempt whose proxy or engine failed it is tried again with a
new rollout (tenacity); one the agent itself failed is not."""
from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from core.settings import RunSettings
from runner.agents import AgentResult, ClientConfig, make_agent
from runner.client import ProxyClient
from runner.errors import InfrastructureError, ProxyRefused, RunInputError
from runner.harness import HarnessAgent
from runner.journal import Journal, Key, read_log
from runner.progress import Display, Outcome
from runner.tasks import EVAL, TRAIN, Task, env_map, read_tasks

NO_KEY = "rlproxy"  # what clients are given as their key when the proxy has keys off (they insist on one)
# Call statuses that, with a 5xx (or no answer at all), say the engine failed, not the agent (a 4xx is the
# agent's own bad request).
BROKEN_CALLS = {"upstream_error", "timeout"}


@dataclass
class Plan:
    settings: RunSettings
    tasks: list[Task]
    agent: Any
    env: dict[str, str]  # VAR -> task field
    attempts: list[tuple[Task, int, int]] = field(default_factory=list)


def agent_named(settings: RunSettings) -> tuple[str, str]:
    """(kind, target) of the one agent the settings name."""
    named = [(kind, value) for kind, value in (("agent", settings.agent), ("command", settings.command),
                                                ("agent-class", settings.agent_class),
                                                ("harness", settings.harness)) if value]
    if len(named) != 1:
        raise RunInputError("name the agent once: --agent module:function, --command \"...\", "
                            "--agent-class module:Class or --harness claude-code|codex")
    return named[0]


def prepare(settings: RunSettings) -> Plan:
    """Everything checked before anything starts: the agent imports, every task file reads, every task has
    the fields `--env-map` names. Raises RunInputError."""
    kind, target = agent_named(settings)
    if settings.tasks is None and settings.eval_tasks is None:
        raise RunInputError("no tasks: give --tasks FILE (JSON lines)")
    mapped = env_map(settings.env_map)
    needed = {field: f"--env-map {variable}={field}" for variable, field in mapped.items()}
    proxy = settings.proxy.rstrip("/")
    if kind == "harness":
        agent = HarnessAgent(target, settings.prompt_field, settings.verify, settings.workdir, settings.repo_field,
                             settings.harness_args)
        needed.update(agent.needed_fields())
    else:
        agent = make_agent(kind, target, {"AGL_OPENAI_BASE_URL": f"{proxy}/v1", "AGL_KEY": settings.key() or NO_KEY,
                                          "AGL_EVENT_URL": f"{proxy}/rollouts/none/events"})
    tasks: list[Task] = []
    if settings.tasks is not None:
        tasks += read_tasks(settings.tasks, TRAIN, settings.task_id_field, needed, settings.eval_share)
    if settings.eval_tasks is not None:
        extra = read_tasks(settings.eval_tasks, EVAL, settings.task_id_field, needed)
        known = {task.id: task.where for task in tasks}
        for task in extra:
            if task.id in known:
                raise RunInputError(f"{task.where}: task id {task.id!r} is also {known[task.id]}")
        tasks += extra
    plan = Plan(settings, tasks, agent, mapped)
    for epoch in range(settings.epochs):
        for task in tasks:
            # evaluation tasks are measured once an epoch; training tasks in groups the trainer compares
            for attempt in range(1 if task.split == EVAL else settings.attempts):
                plan.attempts.append((task, epoch, attempt))
    return plan


class Runner:
    def __init__(self, plan: Plan) -> None:
        self.plan, self.settings = plan, plan.settings
        self.outcomes: list[Outcome] = []

    async def run(self, display_console=None) -> list[Outcome]:
        self.client = ProxyClient(self.settings.proxy, self.settings.key())  # (aiohttp wants a running loop)
        self.journal = Journal(self.settings.log)
        # SIGTERM stops the run as Ctrl-C does: the attempts are cancelled and their processes killed (they run
        # in sessions of their own, so nothing else would stop them)
        with contextlib.suppress(ValueError, NotImplementedError, RuntimeError):  # not the main thread
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
        try:
            if not await self.client.healthy():
                raise ProxyRefused(f"the proxy at {self.settings.proxy} does not answer (GET /healthz)")
            todo = await self._still_to_do()
            display = Display(len(todo), self.settings.success_threshold, display_console)
            queue: asyncio.Queue = asyncio.Queue()
            for item in todo:
                queue.put_nowait(item)
            try:
                workers = [asyncio.create_task(self._work(queue, display))
                           for _ in range(min(self.settings.concurrency, max(len(todo), 1)))]
                await asyncio.gather(*workers)
            finally:
                display.close()
            return self.outcomes
        finally:
            self.journal.close()
            await self.client.close()

    async def _still_to_do(self) -> list[tuple[Task, int, int]]:
        """With --resume, the attempts whose logged rollout the proxy holds a reward for are counted, not run."""
        if not self.settings.resume:
            return list(self.plan.attempts)
        logged = read_log(self.settings.log)
        todo = []
        for task, epoch, attempt in self.plan.attempts:
            rollout_ids = [e["rollout_id"] for e in logged.get((task.id, epoch, attempt), []) if e.get("rollout_id")]
            stored = await self._rewarded(rollout_ids)
            if stored is None:
                todo.append((task, epoch, attempt))
            else:
                self.outcomes.append(Outcome(task.split, "skipped", stored["reward"], stored.get("policy")))
        return todo

    async def _rewarded(self, rollout_ids: list[str]) -> dict[str, Any] | None:
        for rollout_id in reversed(rollout_ids):  # the newest first: earlier ones were given up on
            stored = await self.client.rollout(rollout_id)
            if stored is not None and stored.get("reward") is not None:
                return stored
        return None

    async def _work(self, queue: asyncio.Queue, display: Display) -> None:
        while not queue.empty():
            task, epoch, attempt = queue.get_nowait()
            outcome = await self._attempt(task, epoch, attempt)
            self.outcomes.append(outcome)
            display.advance(outcome, f"{task.id}#{epoch}.{attempt}")

    async def _attempt(self, task: Task, epoch: int, attempt: int) -> Outcome:
        key: Key = (task.id, epoch, attempt)
        tries = 0
        try:
            async for trying in AsyncRetrying(stop=stop_after_attempt(self.settings.retries + 1),
                                              wait=wait_exponential(multiplier=0.5, max=10),
                                              retry=retry_if_exception_type(InfrastructureError), reraise=True):
                with trying:
                    tries += 1
                    return await self._once(task, key, tries)
        except InfrastructureError as exc:
            self._log("finished", key, task, status="infrastructure", error=str(exc), tries=tries)
            return Outcome(task.split, "infrastructure", None, None)
        raise AssertionError("unreachable")

    def _log(self, event: str, key: Key, task: Task, **fields: Any) -> None:
        self.journal.write(event, task_id=key[0], epoch=key[1], attempt=key[2], split=task.split, **fields)

    async def _once(self, task: Task, key: Key, tries: int) -> Outcome:
        settings = self.settings
        evaluation = task.split == EVAL
        created = await self.client.create_rollout(
            task.id, agent=settings.agent_name, evaluation=evaluation,
            metadata={"run": {"epoch": key[1], "attempt": key[2], "split": task.split}})
        self._log("started", key, task, rollout_id=created.rollout_id, tries=tries)
        rollout_root = created.base_url.removesuffix("/v1")
        config = ClientConfig(
            openai_base_url=created.base_url, anthropic_base_url=rollout_root, rollout_id=created.rollout_id,
            reward_url=f"{self.client.proxy}/reward", event_url=f"{rollout_root}/events",
            api_key=settings.key() or NO_KEY, model=settings.model, task_id=task.id, eval=evaluation)
        env = {variable: _text(task.data[name]) for variable, name in self.plan.env.items()}
        began = time.monotonic()
        timed_out = False
        try:
            result = await asyncio.wait_for(self.plan.agent.run(task.data, config, env), settings.timeout)
        except TimeoutError:
            timed_out, result = True, AgentResult(error=f"timed out after {settings.timeout:g} s")
        stored = await self.client.rollout(created.rollout_id) or {}
        if result.error and not timed_out and await self._engine_failed(stored):
            self._log("finished", key, task, rollout_id=created.rollout_id, status="try_failed", error=result.error,
                      tries=tries)
            raise InfrastructureError(result.error)
        reward = stored.get("reward")
        if reward is None and result.reward is not None and not result.error:
            # the agent said its reward and posted none itself (had it, the stored one wins)
            if await self.client.post_reward(created.rollout_id, result.reward):
                reward = result.reward
            else:
                reward = ((await self.client.rollout(created.rollout_id)) or {}).get("reward")
        # a reward posted before the agent hung or failed still counts
        status = ("rewarded" if reward is not None else "timeout" if timed_out
                  else "failed" if result.error else "unrewarded")
        policy = _policy(stored)
        self._log("finished", key, task, rollout_id=created.rollout_id, status=status, reward=reward,
                  policy=policy, error=result.error, tries=tries, seconds=round(time.monotonic() - began, 3),
                  calls=len(stored.get("calls") or []))
        return Outcome(task.split, status, reward, policy)

    async def _engine_failed(self, stored: dict[str, Any]) -> bool:
        """The agent failed because the proxy or engine did: no call was answered and one broke on the engine
        side, or the proxy itself is down."""
        calls = stored.get("calls") or []
        if any(call.get("status") == "ok" for call in calls):
            return False
        broken = any(call.get("status") in BROKEN_CALLS and (call.get("http_status") or 500) >= 500 for call in calls)
        return broken or not await self.client.healthy()


def _policy(stored: dict[str, Any]) -> int | None:
    """The version that answered: its calls' (what X-Rlproxy-Policy said), else the one the rollout was
    created for."""
    versions = [call.get("policy") for call in stored.get("calls") or [] if call.get("policy") is not None]
    return versions[-1] if versions else stored.get("policy")


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)
