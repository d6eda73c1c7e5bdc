"""The run: attempts `concurrency` at a time, a task's attempts next to each other so the trainer gets its groups
early. `rlproxy run` runs the plan `prepare` makes of its flags (`run_plan`); in process, `Runner` runs an agent
function over task dicts, or over any stream of attempts, and hands each finished attempt to the caller:

    async with Runner(solve, RunSettings(proxy="http://127.0.0.1:8400", attempts=4)) as runner:
        outcomes = await runner.run([{"question": "What is 3+4?", "answer": "7"}])
"""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import signal
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from core.settings import RunSettings
from runner.agents import as_agent, make_agent
from runner.function_agent import HostedFunctionAgent
from runner.attempt import NO_KEY, Attempt, AttemptRunner, Outcome
from runner.client import ProxyClient, proxy_url
from runner.environment import check_names
from runner.errors import ProxyRefused, RunInputError
from runner.harnesses import HARNESSES, HarnessAgent
from runner.identity import agent_user, refuse_readable
from runner.journal import Journal, read_log
from runner.pacing import Pacer
from runner.progress import Display
from runner.tasks import EVAL, TRAIN, Task, env_map, make_task, read_tasks

OnAttempt = Callable[[Outcome], Any]  # called (awaited when it returns an awaitable) as each attempt ends


@dataclass
class Plan:
    settings: RunSettings
    tasks: list[Task]
    agent: Any
    env: dict[str, str]  # VAR -> task field
    attempts: list[Attempt] = field(default_factory=list)


def schedule(tasks: Iterable[Task], attempts: int, epochs: int = 1, agent_name: str | None = None) -> list[Attempt]:
    """Evaluation tasks are measured once an epoch; training tasks in groups of `attempts` the trainer
    compares, a group's attempts next to each other."""
    tasks = list(tasks)
    return [Attempt(task, epoch, number, agent_name) for epoch in range(epochs) for task in tasks
            for number in range(1 if task.split == EVAL else attempts)]


def agent_named(settings: RunSettings) -> tuple[str, str]:
    """(kind, target) of the one agent the settings name."""
    named = [(kind, value) for kind, value in (("agent", settings.agent), ("command", settings.command),
                                                ("agent-class", settings.agent_class),
                                                ("harness", settings.harness)) if value]
    if len(named) != 1:
        raise RunInputError("name the agent once: --agent module:function, --command \"...\", "
                            "--agent-class module:Class or --harness NAME")
    return named[0]


HARNESS_FLAGS = (("verify", "--verify"), ("workdir", "--workdir"), ("repo_field", "--repo-field"),
                 ("harness_args", "--harness-args"))


def check_flags(settings: RunSettings, kind: str) -> None:
    """Flags that would be ignored or would overwrite a task file are refused: a careless `--verify` beside
    `--command` must not pass for a verified run."""
    if kind != "harness":
        given = [flag for name, flag in HARNESS_FLAGS if getattr(settings, name)]
        if settings.prompt_field != "prompt":
            given.append("--prompt-field")
        if given:
            raise RunInputError(f"{', '.join(given)}: only for --harness NAME, not --{kind}")
    elif settings.workdir is not None and settings.repo_field:
        raise RunInputError("--workdir or --repo-field: the working folder is a copy of one or a clone of the "
                            "other, not both")
    for flag, path in (("--tasks", settings.tasks), ("--eval-tasks", settings.eval_tasks)):
        if path is not None and _same_file(path, settings.log):
            raise RunInputError(f"--log {settings.log} is the {flag} file: the log is appended to; give another")


def _same_file(one: Path, other: Path) -> bool:
    try:
        return one.samefile(other)
    except OSError:  # either is not there yet
        return False


def prepare(settings: RunSettings) -> Plan:
    """Everything checked before anything starts: the flags, the agent imports, every task file reads, every
    task has the fields `--env-map` names. Raises RunInputError."""
    kind, target = agent_named(settings)
    check_flags(settings, kind)
    if settings.tasks is None and settings.eval_tasks is None:
        raise RunInputError("no tasks: give --tasks FILE (JSON lines)")
    mapped = env_map(settings.env_map)
    check_names(settings.pass_env, mapped)
    needed = {field: f"--env-map {variable}={field}" for variable, field in mapped.items()}
    proxy = proxy_url(settings.proxy)
    user = agent_user(settings.agent_user)
    if user is not None:
        refuse_readable(user, {"--tasks": settings.tasks, "--eval-tasks": settings.eval_tasks, "--log": settings.log})
    if kind == "harness":
        if target not in HARNESSES:
            raise RunInputError(f"--harness {target}: not one of {', '.join(HARNESSES)}")
        agent = HarnessAgent(HARNESSES[target], settings.prompt_field, settings.verify, settings.workdir, settings.repo_field,
                             settings.harness_args, settings.pass_env, user)
        needed.update(agent.needed_fields())
        if agent.shared_folders:  # written by every attempt of the harness: confined agents may (runner/confine.py)
            settings = settings.model_copy(update={"agent_write": (*settings.agent_write, *agent.shared_folders)})
    elif kind == "agent":  # in a process of its own, confined as programs are
        agent = HostedFunctionAgent(target, settings.pass_env, user)
    else:
        agent = make_agent(kind, target, {"AGL_OPENAI_BASE_URL": f"{proxy}/v1",
                                          "AGL_KEY": NO_KEY,  # no rollout yet: each gets its own token
                                          "AGL_EVENT_URL": f"{proxy}/rollouts/none/events"}, settings.pass_env,
                           user)
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
    return Plan(settings, tasks, agent, mapped, schedule(tasks, settings.attempts, settings.epochs))


async def run_plan(plan: Plan, display_console: Console | None = None) -> list[Outcome]:
    """`rlproxy run`: the plan with its log, `--resume` and the progress display."""
    # SIGTERM stops the run as Ctrl-C does: the attempts are cancelled and their processes killed (they run
    # in sessions of their own, so nothing else would stop them)
    with contextlib.suppress(ValueError, NotImplementedError, RuntimeError):  # not the main thread
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
    async with Runner(plan.agent, plan.settings, log=plan.settings.log, progress=True, env=plan.env,
                      console=display_console) as runner:
        return await runner.run_attempts(plan.attempts)


class Runner:
    """An agent driven over tasks through a running proxy, in process.

    `agent`: a function `(task, client_config) -> reward | None`, sync (run in a thread) or async, or an agent
    object of runner/agents.py. `settings`: the proxy, its key, concurrency, attempts, epochs, timeout,
    retries, the rollouts' agent name (`rlproxy run`'s flags; the task files and agent flags are not read).
    `on_attempt(outcome)` is called as each attempt ends; `log`: the JSON lines log to write (and, with
    `settings.resume`, to resume from), none by default; `progress`: draw `rlproxy run`'s progress (never
    with `on_attempt`: a caller who observes the attempts shows them its own way)."""

    def __init__(self, agent: Any, settings: RunSettings | None = None, *, on_attempt: OnAttempt | None = None,
                 log: Path | None = None, progress: bool = False, env: dict[str, str] | None = None,
                 console: Console | None = None) -> None:
        self.settings = settings or RunSettings()
        if on_attempt is not None and progress:
            raise ValueError("on_attempt or progress: a caller who observes the attempts draws its own progress")
        if self.settings.resume and log is None:
            raise ValueError("resume needs the log of the earlier run")
        self.agent, self.on_attempt, self.log, self.progress = as_agent(agent), on_attempt, log, progress
        self.env, self.console = env or {}, console
        check_names(self.settings.pass_env, self.env)  # a task's value never becomes the runner's own variable
        self._attempt: AttemptRunner | None = None

    async def __aenter__(self) -> Runner:
        await self.open()
        return self

    async def __aexit__(self, *_: Any) -> None:
        await self.close()

    async def open(self) -> None:
        """Opens the log (RunInputError when another run holds it) and connects to the proxy (ProxyRefused when it
        does not answer; RunInputError when the key the agents would get is an administrator's, or when there is
        no log to resume from)."""
        if self.settings.resume and self.log is not None and not self.log.exists():  # a mistyped --log: all again
            raise RunInputError(f"--resume: the log {self.log} does not exist, so there is nothing to resume from: "
                                "check its name (--log), or leave out --resume to start a run")
        self.journal = Journal(self.log) if self.log is not None else None
        try:
            self.client = ProxyClient(self.settings.proxy, self.settings.key())  # (aiohttp wants a running loop)
        except RunInputError:
            if self.journal is not None:
                self.journal.close()
            raise
        self._attempt = AttemptRunner(self.client, self.agent, self.settings, self.env, self.journal)
        health = await self.client.health_status()
        if health != 200:
            await self.close()
            if health is None:
                raise ProxyRefused(f"the proxy at {self.settings.proxy} does not answer (GET /healthz): is `rlproxy "
                                   "serve` running there?")
            raise ProxyRefused(self.client.not_the_proxy(health))
        agent_key = self.settings.agent_key()
        if agent_key and await self.client.key_administers(agent_key):
            await self.close()  # agents run code a model wrote: they would hold the keys to every policy
            if self.settings.agent_api_key is not None:
                raise RunInputError("the agents' key (--agent-api-key) is an administrator's: give them a project "
                                    "key without admin rights (rlproxy keys create --project P)")
            raise RunInputError("the runner's key is an administrator's, and without --agent-api-key every agent "
                                "gets it: give the agents a project key of their own (RLPROXY_AGENT_API_KEY, or "
                                "--agent-api-key-file)")

    async def close(self) -> None:
        if self._attempt is None:
            return
        self._attempt = None
        if self.journal is not None:
            self.journal.close()
        await self.client.close()

    async def run(self, tasks: Iterable[dict[str, Any] | Task], *, attempts: int | None = None,
                  epochs: int | None = None, evaluation: bool = False,
                  agent_name: str | None = None) -> list[Outcome]:
        """Every task `attempts` times (default `settings.attempts`; evaluation tasks once) for `epochs`
        passes. A task dict's id is `settings.task_id_field` or a hash of it, and `settings.eval_share` holds
        some out; a Task is taken as it is. `evaluation`: all of them as evaluation rollouts. A task may
        appear more than once (another group of it). Returns every attempt's outcome, in the order they
        ended."""
        split = EVAL if evaluation else TRAIN
        prepared = []
        for index, task in enumerate(tasks):
            if isinstance(task, Task):
                prepared.append(replace(task, split=EVAL) if evaluation else task)
            elif isinstance(task, dict):
                prepared.append(make_task(task, f"task {index}", split, self.settings.task_id_field,
                                          self.settings.eval_share))
            else:
                raise TypeError(f"task {index}: a dict or a runner.tasks.Task, not {type(task).__name__}")
        return await self.run_attempts(schedule(prepared, attempts or self.settings.attempts,
                                                epochs or self.settings.epochs, agent_name))

    async def run_attempts(self, source: Iterable[Attempt] | AsyncIterable[Attempt]) -> list[Outcome]:
        """The attempts `settings.concurrency` at a time, each taken from `source` when a place is free: a
        list, or an async iterator that may wait before it gives the next one (it is never asked by two
        places at once) and ends the run by ending. Returns every outcome, in the order they ended (with
        `settings.resume`, the attempts the log shows rewarded first, as "skipped")."""
        if self._attempt is None:
            raise RuntimeError("the runner is not open: `async with Runner(...) as runner`")
        outcomes: list[Outcome] = []
        display = None
        if isinstance(source, AsyncIterable):
            if self.progress or self.settings.resume:
                raise ValueError("progress and resume need a list of attempts, not an async iterator")
            pending, places = aiter(source), self.settings.concurrency
        else:
            todo = await self._still_to_do(list(source), outcomes)
            pending, places = _aiter(todo), min(self.settings.concurrency, max(len(todo), 1))
            if self.progress:
                display = Display(len(todo), self.settings.success_threshold, self.console)
                if self.settings.resume:
                    display.note(_resumed(self.log, len(outcomes), len(todo)))
        taking = asyncio.Lock()  # an async generator cannot be asked for its next item twice at once
        pacer = None
        if self.settings.max_untrained:
            pacer = Pacer(self.client, self.settings.max_untrained, say=display.note if display else None)
            # a resumed run's earlier rewards wait for the trainer too (the first wait drops those it has trained)
            pacer.untrained.update(o.rollout_id for o in outcomes if o.split == TRAIN and o.rollout_id)

        async def work() -> None:
            while True:
                async with taking:  # held while the pacer waits, so attempts still start in their order
                    attempt = await anext(pending, None)
                    paced = pacer is not None and attempt is not None and attempt.task.split == TRAIN
                    if paced:
                        await pacer.enter()
                if attempt is None:
                    return
                outcome = await self._attempt(attempt)
                if paced:
                    pacer.leave(outcome)
                outcomes.append(outcome)
                if display is not None:
                    display.advance(outcome, attempt.label)
                if self.on_attempt is not None and inspect.isawaitable(told := self.on_attempt(outcome)):
                    await told

        try:
            await _all_or_none([asyncio.create_task(work()) for _ in range(places)])
        finally:
            if display is not None:
                display.close()
        return outcomes

    async def _still_to_do(self, attempts: list[Attempt], outcomes: list[Outcome]) -> list[Attempt]:
        """With resume, the attempts whose logged rollout the proxy holds a reward for are counted, not run."""
        if not self.settings.resume:
            return attempts
        logged = read_log(self.log)
        todo = []
        for attempt in attempts:
            rollout_ids = [e["rollout_id"] for e in logged.get(attempt.key, []) if e.get("rollout_id")]
            stored = await self._rewarded(rollout_ids)
            if stored is None:
                todo.append(attempt)
            else:
                outcomes.append(Outcome(attempt.task.split, "skipped", stored["reward"], stored.get("policy"),
                                        attempt, stored.get("rollout_id")))
        return todo

    async def _rewarded(self, rollout_ids: list[str]) -> dict[str, Any] | None:
        for rollout_id in reversed(rollout_ids):  # the newest first: earlier ones were given up on
            stored = await self.client.rollout(rollout_id)
            if stored is not None and stored.get("reward") is not None:
                return stored
        return None


def _resumed(log: Path, skipped: int, todo: int) -> str:
    if not todo:
        return f"nothing left to do: every attempt has its reward in {log} ({skipped} skipped)"
    return f"resuming from {log}: {skipped} attempts rewarded there are skipped, {todo} to run"


async def _aiter(items: list[Attempt]) -> AsyncIterator[Attempt]:
    for item in items:
        yield item


async def _all_or_none(workers: list[asyncio.Task]) -> None:
    """Waits for every worker; when one fails, or this is cancelled (Ctrl-C, SIGTERM), the others are
    cancelled (their agents' processes killed) before the error goes on."""
    try:
        await asyncio.wait(workers, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for worker in workers:
            worker.cancel()
        await asyncio.wait(workers)
    for worker in workers:
        if not worker.cancelled() and worker.exception() is not None:
            raise worker.exception()
