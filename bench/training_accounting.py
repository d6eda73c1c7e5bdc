"""What the trainer did with a run's rewarded rollouts, read back from the store after the run: how many were
trained, and why the others were not. For the learning benches (bench/run_learning.py, bench/live_traffic.py).

Two views, both from what the trainer recorded:
- per call, summed over the step records (`train_steps.metrics`): calls trained by lag in versions
  (`staleness.trained_by_lag`), calls dropped as stale by lag (`staleness.dropped_by_lag`), and every skip reason
  the steps counted (`skipped`: calls or transitions, each under its own reason);
- per rollout, each of the run's rollouts classified once, as the trainer's batch builder (trainer/batch.py) would:
  `trained` (at least one call within `max_staleness` of the version its step trained, in a task group whose
  rewards differ), `zero_advantage` (its group's rewards were all equal: no signal whatever the correction),
  `stale` (every call more than `max_staleness` versions behind the version its step trained from), `no_calls` (no call that completed), and
  `unclaimed` (no step took it).

    accounting = account(database_url, rollout_ids, max_staleness=8)
    accounting.describe()   # "rollouts: trained 80/96, zero_advantage 16, ...; calls: lag 0:60 1:40 ..., ..."
"""
from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import psycopg

BASE_VERSION = 0  # store/policies.py: calls answered by the base model


def libpq_url(url: str) -> str:
    """The store's SQLAlchemy URL (postgresql+asyncpg://...) as psycopg takes it."""
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


@dataclass
class Accounting:
    rollouts: Counter = field(default_factory=Counter)  # per rollout: trained, zero_advantage, stale, ...
    trained_by_lag: Counter = field(default_factory=Counter)  # calls, from the step records
    dropped_by_lag: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)  # every reason the steps counted
    steps: int = 0
    is_filtered: list[float] = field(default_factory=list)  # per step: share of tokens the correction clipped
    off_policy_kl: list[float] = field(default_factory=list)
    ratio_max: list[float] = field(default_factory=list)
    age_s_max: list[float] = field(default_factory=list)
    # rollouts the steps after the first took per minute, first step to last: what a busy trainer consumes
    # (bench/live_traffic.py sets its rates relative to it)
    consumed_per_min: float | None = None

    @property
    def total(self) -> int:
        return sum(self.rollouts.values())

    def as_dict(self) -> dict[str, Any]:
        return {"rollouts": dict(self.rollouts), "trained_by_lag": dict(self.trained_by_lag),
                "dropped_by_lag": dict(self.dropped_by_lag), "skipped": dict(self.skipped), "steps": self.steps}

    def describe(self) -> str:
        others = ", ".join(f"{reason} {n}" for reason, n in sorted(self.rollouts.items()) if reason != "trained")
        lags = " ".join(f"{lag}:{n}" for lag, n in sorted(self.trained_by_lag.items())) or "-"
        dropped = " ".join(f"{lag}:{n}" for lag, n in sorted(self.dropped_by_lag.items())) or "none"
        skipped = ", ".join(f"{reason} {n}" for reason, n in sorted(self.skipped.items()) if n) or "none"
        line = (f"rollouts trained {self.rollouts['trained']}/{self.total} ({others or 'none dropped'}); "
                f"{self.steps} steps; calls trained by lag {lags}, stale dropped by lag {dropped}; "
                f"skipped (calls/transitions) {skipped}")
        if self.is_filtered:
            line += (f"; per step: IS clipped/masked {100 * statistics.fmean(self.is_filtered):.1f}% mean, "
                     f"off-policy KL {statistics.fmean(self.off_policy_kl):.3f} mean, "
                     f"PPO ratio max {max(self.ratio_max):.2f}")
        if self.age_s_max:
            line += f", call age max {max(self.age_s_max):.0f} s"
        if self.consumed_per_min is not None:
            line += f"; the trainer consumed {self.consumed_per_min:.1f} rollouts/min"
        return line


def account(database_url: str, rollout_ids: list[str], *, max_staleness: int) -> Accounting:
    """The run's rollouts (`rollout_ids`) and every step the trainer recorded in the store at `database_url`
    (one bench run's own database: every step in it is the run's)."""
    result = Accounting()
    with psycopg.connect(libpq_url(database_url)) as conn:
        steps = conn.execute(
            "SELECT metrics, rollout_count, created_at, id, policy_version FROM train_steps ORDER BY id").fetchall()
        for metrics, *_ in steps:
            _add_step(result, metrics or {})
        if len(steps) >= 2 and (span := (steps[-1][2] - steps[0][2]).total_seconds()) > 0:
            result.consumed_per_min = 60 * sum(step[1] for step in steps[1:]) / span
        step_versions = [(step[3], step[4]) for step in steps]
        # a version's position in its policy's line: versions are numbered across policies (store/policies.py)
        position = {BASE_VERSION: 0}
        parents: dict[int, int] = {}
        lines: dict[str, int] = defaultdict(int)
        for version, policy, parent in conn.execute(
                "SELECT version, policy, parent_version FROM policies ORDER BY version"):
            lines[policy] += 1
            position[version] = lines[policy]
            parents[version] = parent if parent is not None else BASE_VERSION
        rows = conn.execute(
            "SELECT r.id, r.task_id, r.reward, r.train_step_id, s.policy_version FROM rollouts r "
            "LEFT JOIN train_steps s ON s.id = r.train_step_id WHERE r.id = ANY(%s)", (rollout_ids,)).fetchall()
        calls: dict[str, list[int | None]] = defaultdict(list)
        for rollout_id, version in conn.execute(
                "SELECT rollout_id, policy_version FROM calls WHERE rollout_id = ANY(%s) AND status = 'ok'",
                (rollout_ids,)):
            calls[rollout_id].append(version)
    # the version each step trained from: its new version's parent; a step that trained nothing records no new
    # version, and trained from the one the step before it made (one trainer, one line: versions follow steps)
    trained_from: dict[int, int] = {}
    latest = BASE_VERSION
    for step_id, new_version in step_versions:
        trained_from[step_id] = parents.get(new_version, latest) if new_version is not None else latest
        latest = new_version if new_version is not None else latest
    groups: dict[tuple[int, str], set[float]] = defaultdict(set)  # (step, task) -> its rewards
    for _, task, reward, step, _ in rows:
        if step is not None:
            groups[(step, task)].add(float(reward or 0.0))
    for rollout_id, task, _, step, _ in rows:
        result.rollouts[_classify(calls[rollout_id], step, trained_from.get(step), groups.get((step, task), set()),
                                  position, max_staleness)] += 1
    return result


def _classify(versions: list[int | None], step: int | None, trained_from: int | None, group_rewards: set[float],
              position: dict[int, int], max_staleness: int) -> str:
    if step is None:
        return "unclaimed"
    if not versions:
        return "no_calls"
    at = position.get(trained_from if trained_from is not None else BASE_VERSION, 0)
    if all(v is not None and at - position.get(v, 0) > max_staleness for v in versions):
        return "stale"
    if len(group_rewards) < 2:
        return "zero_advantage"
    return "trained"


def _add_step(result: Accounting, metrics: dict[str, Any]) -> None:
    result.steps += 1
    result.skipped.update(metrics.get("skipped") or {})
    staleness = metrics.get("staleness") or {}
    result.trained_by_lag.update({int(lag): n for lag, n in (staleness.get("trained_by_lag") or {}).items()})
    result.dropped_by_lag.update({int(lag): n for lag, n in (staleness.get("dropped_by_lag") or {}).items()})
    if staleness.get("age_s_max") is not None:
        result.age_s_max.append(float(staleness["age_s_max"]))
    if "is_filtered" in metrics:
        result.is_filtered.append(float(metrics["is_filtered"]))
        result.off_policy_kl.append(float(metrics.get("off_policy_kl", 0.0)))
        result.ratio_max.append(float(metrics.get("ratio_max", 1.0)))
