"""The trainer's step records read back per named policy: its steps over time (the web view's training page) and
its yield over the recent steps (`GET /policies`).

    await policy_steps(session, "default", limit=500)   # oldest first: one point per step, charted fields only
    await recent_yield(session, "default", window=10)   # calls seen, trained, skipped by reason over the window

A step that trained a policy is a `train_steps` row whose `policy_version` is a version of that policy, its
`metrics` a step record (core/step_record.py). A step that trained nothing has no version; its `metrics` hold
each policy's yield under `policies` (trainer/yields.py StepYield.untrained), so those steps count too: a policy
whose every call is skipped has steps with no version, and its yield is what shows it. A failed step (no
policy's yield: `failed`) is left out of both.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from core.step_record import StepRecord
from store.models import Policy, TrainStep

# The fields of a step record the training page charts (tests/test_training_view.py checks each is a field).
CHARTED = ("reward_mean", "kl", "clip_fraction", "agreement_kl", "loss", "entropy", "off_policy_kl", "is_filtered",
           "rollouts", "transitions", "calls_seen", "calls_trained", "calls_skipped", "served_version", "teacher_kl")
MAX_STEPS = 2000


async def _rows(session: AsyncSession, policy: str, limit: int) -> list[TrainStep]:
    """The newest `limit` step rows that trained `policy` or trained nothing, newest first."""
    query = (select(TrainStep).outerjoin(Policy, Policy.version == TrainStep.policy_version)
             .where(or_(Policy.policy == policy, TrainStep.policy_version.is_(None)))
             .order_by(TrainStep.id.desc()).limit(limit))
    return list((await session.execute(query)).scalars())


def _yield_of(step: TrainStep, policy: str) -> dict[str, Any] | None:
    """The policy's yield in one step: the record's own fields, or its line of a step that trained nothing."""
    metrics = step.metrics or {}
    if step.policy_version is not None:
        return metrics
    return (metrics.get("policies") or {}).get(policy)


def _staleness(metrics: dict[str, Any]) -> dict[str, Any]:
    staleness = metrics.get("staleness") or {}
    return {"lag_mean": staleness.get("lag_mean"), "lag_max": staleness.get("lag_max"),
            "dropped_stale": sum((staleness.get("dropped_by_lag") or {}).values()),
            "age_s_mean": staleness.get("age_s_mean")}


async def policy_steps(session: AsyncSession, policy: str, *, limit: int = 500) -> list[dict[str, Any]]:
    """`policy`'s last `limit` steps (at most MAX_STEPS), oldest first: for each its id, time, the version it made
    (None: the step trained nothing of it), the charted fields of its record, and its staleness summary."""
    out = []
    for step in await _rows(session, policy, min(limit, MAX_STEPS)):
        line = _yield_of(step, policy)
        if line is None:
            continue
        record = StepRecord.from_dict(line) if step.policy_version is not None else StepRecord.from_dict(
            {"calls_seen": line.get("calls_seen", 0), "calls_trained": line.get("calls_trained", 0),
             "calls_skipped": line.get("calls_skipped") or {}})
        values = {name: getattr(record, name) for name in CHARTED}
        if step.policy_version is None:  # nothing trained: no loss, reward or KL of this policy to chart
            values.update({name: None for name in CHARTED if name not in ("calls_seen", "calls_trained",
                                                                            "calls_skipped")})
        out.append({"step_id": step.id, "at": step.created_at.isoformat() if step.created_at else None,
                    "version": step.policy_version, **values,
                    "staleness": _staleness(step.metrics or {})})
    return out[::-1]


async def recent_yield(session: AsyncSession, policy: str, *, window: int = 10) -> dict[str, Any]:
    """What became of `policy`'s calls over its last `window` steps: seen, trained, and not trained by reason,
    the share trained (None before any call), and how many steps that was."""
    seen = trained = steps = 0
    skipped: Counter = Counter()
    for step in await _rows(session, policy, window * 4):  # untrained steps of other policies are read too
        line = _yield_of(step, policy)
        if line is None:
            continue
        seen += int(line.get("calls_seen") or 0)
        trained += int(line.get("calls_trained") or 0)
        skipped.update(line.get("calls_skipped") or {})
        steps += 1
        if steps == window:
            break
    return {"steps": steps, "calls_seen": seen, "calls_trained": trained, "calls_skipped": dict(skipped),
            "share_trained": trained / seen if seen else None}
