"""The demo task's measurement (`rlproxy eval`, the demo, and through demo/score.py `rlproxy train --gate
heldout`): one episode of the demo agent per task of a split of the demo task family, against any
OpenAI-compatible base URL (the proxy, or the engine directly), its success with a 95% Wilson interval, and
the held-out result kept as the version's `heldout` verdict (store/verdicts.py).

The gates decide with the one promotion rule, core/promotion.py (why it allows a margin is said there).
"""
from __future__ import annotations

import hashlib
from datetime import datetime
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import openai
from sqlalchemy.ext.asyncio import AsyncSession

from core.settings import PLACEHOLDER_KEY
from demo.agent import evaluate_detailed
from demo.tasks import Task, heldout_tasks
from store import policies, verdicts
from store.db import short_session
from store.evaluation import wilson
from store.models import utcnow
from trainer.gates.evaluate import EvalError, resolve


def task_set(tasks: list[Task]) -> str:
    """A short digest naming the exact tasks measured, so results are only compared on the same tasks."""
    return hashlib.sha256("\n".join(t.task_id for t in tasks).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class HeldoutResult:
    model: str
    success: float  # mean reward; an episode whose API call failed counts as 0
    tasks: int
    low: float  # 95% Wilson interval
    high: float
    errors: int
    seconds: float
    task_set: str
    when: str  # ISO 8601, UTC
    first_error: str | None = None  # of the episodes that failed, the first one's error

    @property
    def successes(self) -> float:
        return self.success * self.tasks

    def describe(self) -> str:
        return (f"{self.success:.1%} ({self.successes:g}/{self.tasks}), 95% CI {self.low:.1%}–{self.high:.1%}"
                + (f", {self.errors} episodes failed" if self.errors else ""))


async def evaluate_heldout(base_url: str, model: str, tasks: list[Task], *, concurrency: int = 8,
                           api_key: str = PLACEHOLDER_KEY, max_retries: int = 2,
                           on_episode: Callable[[], None] | None = None) -> HeldoutResult:
    """One episode per task of `model` at `base_url` (ending in /v1); `on_episode()` as each one ends."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=max_retries)
    try:
        stats = await evaluate_detailed(client, model, tasks, concurrency=concurrency, on_episode=on_episode)
    finally:
        await client.close()
    low, high = wilson(stats.success * stats.n, stats.n)
    failed = next((str(r) for r in stats.results if isinstance(r, BaseException)), None)
    return HeldoutResult(model=model, success=stats.success, tasks=stats.n, low=low, high=high, errors=stats.errors,
                         seconds=stats.seconds, task_set=task_set(tasks), when=utcnow().isoformat(),
                         first_error=failed)


# --- the store ---------------------------------------------------------------------------------------


async def record(session: AsyncSession, version: int, result: HeldoutResult, **extra: Any) -> bool:
    """Keep the result (and `extra`, e.g. parent and verdict) as the version's `heldout` verdict. The base model
    (version 0) has no row: nothing is stored and False is returned."""
    if version == policies.BASE_VERSION:
        return False
    await verdicts.add(session, version, verdicts.HELDOUT, score=result.success, measured=result.task_set,
                       created_at=datetime.fromisoformat(result.when), evidence={
                           "heldout_tasks": result.tasks, "heldout_ci95": [result.low, result.high],
                           "heldout_errors": result.errors, "heldout_seconds": round(result.seconds, 2), **extra})
    return True


# --- `rlproxy eval` ------------------------------------------------------------------------------------


async def evaluate_policy(version: int, database_url: str, *, proxy: str | None = None, upstream: str | None = None,
                          tasks: int = 48, seed: int = 0, concurrency: int = 8,
                          api_key: str = PLACEHOLDER_KEY) -> tuple[HeldoutResult, bool]:
    """Measure policy `version` (v0: the base model) on `tasks` held-out tasks, through a proxy or on an
    engine directly (trainer/gates/evaluate.py finds it), and store the result on its row. Returns the result and
    whether it was stored."""
    try:
        chosen = heldout_tasks(tasks, seed=seed)
    except ValueError as exc:
        raise EvalError(str(exc)) from None
    target = await resolve(version, database_url, proxy=proxy, upstream=upstream, api_key=api_key)
    result = await evaluate_heldout(f"{target.url}/v1", target.model, chosen, concurrency=concurrency,
                                    api_key=api_key)
    if result.errors == result.tasks:  # a measurement of the connection, not of the policy: keep nothing
        raise EvalError(f"every episode failed ({target.model} at {target.url}): {result.first_error}")
    if target.row is None:
        return result, False
    async with short_session(database_url) as sessions, sessions() as session, session.begin():
        return result, await record(session, version, result)
