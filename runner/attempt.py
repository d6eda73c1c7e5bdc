"""One attempt: a rollout created for it, the agent run with the rollout's URLs, a final reward made sure of. A
try the proxy or engine failed is tried again with a new rollout (tenacity); one the agent itself failed is
not."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from core.settings import RunSettings
from runner import confine
from runner.agents import AgentResult, ClientConfig, FunctionAgent
from runner.client import ProxyClient, calls_summary
from runner.errors import AttemptError, InfrastructureError, RolloutRefused, TaskDataError
from runner.journal import Journal, Key
from runner.task_data import env_value, task_id
from runner.tasks import EVAL, Task

GRADER = "grader"  # reward_source of a rollout whose final reward the runner gives
NO_KEY = "rlproxy"  # what clients are given as their key when the proxy has keys off (they insist on one)
# Call statuses that, with a 5xx (or no answer at all), say the engine failed, not the agent (a 4xx is the
# agent's own bad request).
BROKEN_CALLS = {"upstream_error", "timeout"}


@dataclass(frozen=True)
class Attempt:
    """One (task, epoch, attempt number): one rollout, tried again on a new one after an infrastructure
    failure."""

    task: Task
    epoch: int = 0
    number: int = 0  # within its task's group
    agent_name: str | None = None  # the rollout's agent (policy rules route by it); None: the run's

    @property
    def key(self) -> Key:
        return (self.task.id, self.epoch, self.number)

    @property
    def label(self) -> str:
        return f"{self.task.id}#{self.epoch}.{self.number}"


@dataclass(frozen=True)
class Outcome:
    """One attempt's end, as counted."""

    split: str
    status: str  # rewarded, unrewarded, failed, timeout, infrastructure, skipped (rewarded in an earlier run)
    reward: float | None
    policy: int | None  # the version that answered (its last call's)
    attempt: Attempt | None = None
    rollout_id: str | None = None
    error: str | None = None  # why the agent failed (its exception, exit status, timeout)
    tries: int = 0  # rollouts created for it (more than one after infrastructure failures)
    policies: tuple[int | None, ...] = ()  # the versions its calls were answered by, in the order each first was
    claims: int = 0  # final rewards its agent posted that were kept as claims (the runner gives the reward)


class AttemptRunner:
    def __init__(self, client: ProxyClient, agent: Any, settings: RunSettings, env: dict[str, str],
                 journal: Journal | None) -> None:
        self.client, self.agent, self.settings, self.env, self.journal = client, agent, settings, env, journal
        # a harness's --verify result is the reward, whatever the harness posts (runner/harnesses/)
        self.verified = bool(getattr(agent, "verify", None))
        self._confine()

    def _confine(self) -> None:
        """The agents' programs kept from the journal, the task files, the key files and one another
        (runner/confine.py); each attempt's "started" line says whether it was and why not (RunInputError under
        --require-confinement where they cannot be)."""
        settings = self.settings
        in_caller = isinstance(self.agent, FunctionAgent)
        why_not = ("a function handed to runner.Runner runs inside its process" if in_caller
                   else "--no-confine-agents" if not settings.confine_agents else None)
        confined, why = confine.start(
            [self.journal.path if self.journal is not None else None, settings.tasks, settings.eval_tasks],
            read=settings.agent_read, write=settings.agent_write, required=settings.require_confinement,
            why_not=why_not)
        version = confine.active().version if confined else None
        # on each attempt's "started" line: a run refused before any attempt leaves its journal as it was
        self.confinement = {"confined": confined, **({"landlock_abi": version} if version else {"why": why})}

    async def __call__(self, attempt: Attempt) -> Outcome:
        try:
            env = self._checked(attempt.task)
        except TaskDataError as exc:  # before any rollout exists: this attempt fails, the run goes on
            self._log("finished", attempt, status="failed", error=str(exc), tries=0)
            return Outcome(attempt.task.split, "failed", None, None, attempt, error=str(exc))
        tries = 0
        try:
            async for trying in AsyncRetrying(stop=stop_after_attempt(self.settings.retries + 1),
                                              wait=wait_exponential(multiplier=0.5, max=10),
                                              retry=retry_if_exception_type(InfrastructureError), reraise=True):
                with trying:
                    tries += 1
                    return await self._once(attempt, tries, env)
        except InfrastructureError as exc:
            self._log("finished", attempt, status="infrastructure", error=str(exc), tries=tries)
            return Outcome(attempt.task.split, "infrastructure", None, None, attempt, error=str(exc), tries=tries)
        except RolloutRefused as exc:  # what this attempt sent was refused: it fails, the run goes on
            self._log("finished", attempt, status="failed", error=str(exc), tries=tries)
            return Outcome(attempt.task.split, "failed", None, None, attempt, error=str(exc), tries=tries)
        raise AssertionError("unreachable")

    def _log(self, event: str, attempt: Attempt, **fields: Any) -> None:
        if self.journal is not None:
            task_id, epoch, number = attempt.key
            self.journal.write(event, task_id=task_id, epoch=epoch, attempt=number, split=attempt.task.split,
                               **fields)

    def _checked(self, task: Task) -> dict[str, str]:
        """The `--env-map` variables of this task, its id and whatever else the agent checks of it
        (`check_task`): each handed over as data, or TaskDataError with the reason."""
        task_id(task.id)
        env = {variable: env_value(task.data[name], variable, name) for variable, name in self.env.items()}
        check = getattr(self.agent, "check_task", None)
        if check is not None:
            check(task.data)
        return env

    async def _once(self, attempt: Attempt, tries: int, env: dict[str, str]) -> Outcome:
        settings, task = self.settings, attempt.task
        evaluation = task.split == EVAL
        # The runner gives the reward of an evaluation attempt (its reward is evidence the gates promote on) and
        # of a verified one (--verify's result is final): what the agent posts to such a rollout is a claim.
        graded = evaluation or self.verified
        created = await self.client.create_rollout(
            task.id, agent=attempt.agent_name or settings.agent_name, evaluation=evaluation,
            metadata={"run": {"epoch": attempt.epoch, "attempt": attempt.number, "split": task.split}},
            owner_key=settings.agent_key() if settings.agent_api_key is not None else None,
            reward_source=GRADER if graded else None)
        rollout_id = created.rollout_id
        self._log("started", attempt, rollout_id=rollout_id, tries=tries, **self.confinement)
        rollout_root = created.base_url.removesuffix("/v1")
        config = ClientConfig(
            openai_base_url=created.base_url, anthropic_base_url=rollout_root, rollout_id=rollout_id,
            reward_url=f"{self.client.proxy}/reward", event_url=f"{rollout_root}/events",
            # the rollout's own token, never a project key: it reaches this rollout alone (docs/security.md)
            api_key=created.token or settings.agent_key() or NO_KEY, model=settings.model, task_id=task.id,
            eval=evaluation)
        began = time.monotonic()
        timed_out = False
        try:
            result = await asyncio.wait_for(self.agent.run(task.data, config, env), settings.timeout)
        except TimeoutError:
            timed_out, result = True, AgentResult(error=f"timed out after {settings.timeout:g} s")
        except AttemptError as exc:  # its program could not be started (the task's data too large, say)
            result = AgentResult(error=str(exc))
        stored = await self.client.rollout(rollout_id) or {}
        if result.error and not timed_out and await self._engine_failed(stored):
            self._log("finished", attempt, rollout_id=rollout_id, status="try_failed", error=result.error,
                      tries=tries)
            raise InfrastructureError(result.error)
        reward = stored.get("reward")
        if reward is None and result.reward is not None and not result.error:
            # the agent said its reward (the verifier, for a harness) and, unless the runner gives it, posted none
            # itself (had it, the stored one wins); a graded rollout takes it from the grader token alone
            if await self.client.post_reward(rollout_id, result.reward, key=created.grader_token):
                reward = result.reward
            else:
                reward = ((await self.client.rollout(rollout_id)) or {}).get("reward")
        claims = sum(1 for entry in stored.get("rewards") or () if entry.get("claim"))
        # a reward posted before the agent hung or failed still counts
        status = ("rewarded" if reward is not None else "timeout" if timed_out
                  else "failed" if result.error else "unrewarded")
        policy = _policy(stored)
        summary = calls_summary(stored)
        self._log("finished", attempt, rollout_id=rollout_id, status=status, reward=reward, policy=policy,
                  error=result.error, tries=tries, seconds=round(time.monotonic() - began, 3),
                  calls=summary["call_count"], **({"claims": claims} if claims else {}))
        return Outcome(task.split, status, reward, policy, attempt, rollout_id, result.error, tries,
                       tuple(entry["policy"] for entry in summary["policies"]), claims)

    async def _engine_failed(self, stored: dict[str, Any]) -> bool:
        """The agent failed because the proxy or engine did: no call was answered and one broke on the engine
        side, or the proxy itself is down."""
        statuses = calls_summary(stored)["statuses"]
        if any(entry["status"] == "ok" for entry in statuses):
            return False
        broken = any(entry["status"] in BROKEN_CALLS and (entry["http_status"] or 500) >= 500 for entry in statuses)
        return broken or not await self.client.healthy()


def _policy(stored: dict[str, Any]) -> int | None:
    """The version that answered: its last call's (what X-Rlproxy-Policy said), else the one the rollout was
    created for."""
    answered = [entry for entry in calls_summary(stored)["policies"] if entry["policy"] is not None]
    return max(answered, key=lambda entry: entry["last_seq"] or 0)["policy"] if answered else stored.get("policy")

