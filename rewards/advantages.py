"""Advantage estimators over per-rollout scalar returns.

Rollouts of the same task_id form a group and are baselined against each other; rollouts without a
group are baselined against the batch. Every function takes and returns plain lists of floats.
"""
from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence

from core.checks import require_finite

GRPO = "grpo"
RLOO = "rloo"
REINFORCE_BASELINE = "reinforce_baseline"
REINFORCE = "reinforce"

ESTIMATORS: tuple[str, ...] = (GRPO, RLOO, REINFORCE_BASELINE, REINFORCE)

# Estimators whose baseline comes from the other members of a group: a group of one teaches nothing.
NEEDS_GROUP: frozenset[str] = frozenset({GRPO, RLOO, REINFORCE_BASELINE})

DEFAULT_EPS = 1e-6


def _checked(values: Sequence[float], what: str = "return") -> list[float]:
    return [require_finite(v, f"{what} #{i}") for i, v in enumerate(values)]


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def _population_std(values: Sequence[float], mean: float) -> float:
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))


def _all_equal(values: Sequence[float]) -> bool:
    # Checked explicitly: r - mean of equal floats can be a rounding crumb, which /(std + eps) would inflate.
    return min(values) == max(values)


def normalize(values: Sequence[float], *, eps: float = DEFAULT_EPS) -> list[float]:
    """Whiten a batch: (v - mean) / (std + eps), population std. All-equal values give zeros."""
    values = _checked(values, "value")
    if not values or _all_equal(values):
        return [0.0] * len(values)
    mean = _mean(values)
    std = _population_std(values, mean)
    return [(v - mean) / (std + eps) for v in values]


def grpo(returns: Sequence[float], *, eps: float = DEFAULT_EPS) -> list[float]:
    """GRPO: A_i = (r_i - mean(r)) / (std(r) + eps), population std. An all-equal group gives zeros."""
    return normalize(_checked(returns), eps=eps)


def rloo(returns: Sequence[float]) -> list[float]:
    """REINFORCE leave-one-out: A_i = r_i - (sum(r) - r_i) / (n - 1). A group of one gives 0."""
    returns = _checked(returns)
    n = len(returns)
    if n <= 1:
        return [0.0] * n
    total = math.fsum(returns)
    return [r - (total - r) / (n - 1) for r in returns]


def reinforce_baseline(returns: Sequence[float]) -> list[float]:
    """REINFORCE with the group mean as baseline: A_i = r_i - mean(r)."""
    returns = _checked(returns)
    if not returns or _all_equal(returns):
        return [0.0] * len(returns)
    mean = _mean(returns)
    return [r - mean for r in returns]


def reinforce(returns: Sequence[float]) -> list[float]:
    """Plain REINFORCE: A_i = r_i."""
    return _checked(returns)


def batch_baseline(
    returns: Sequence[float], *, normalize_std: bool = False, eps: float = DEFAULT_EPS
) -> list[float]:
    """For rollouts without a task group: A_i = r_i - mean(batch).

    With normalize_std: A_i = (r_i - mean(batch)) / (std(batch) + eps).
    """
    if normalize_std:
        return normalize(returns, eps=eps)
    return reinforce_baseline(returns)


def estimate(returns: Sequence[float], estimator: str, *, eps: float = DEFAULT_EPS) -> list[float]:
    """Apply the named estimator (one of ESTIMATORS) to one group of returns."""
    if estimator == GRPO:
        return grpo(returns, eps=eps)
    if estimator == RLOO:
        return rloo(returns)
    if estimator == REINFORCE_BASELINE:
        return reinforce_baseline(returns)
    if estimator == REINFORCE:
        return reinforce(returns)
    raise ValueError(f"unknown advantage estimator {estimator!r}; expected one of {ESTIMATORS}")


def group_advantages(
    items: Iterable[tuple[Hashable | None, float]],
    estimator: str = GRPO,
    *,
    eps: float = DEFAULT_EPS,
    batch_std: bool | None = None,
) -> list[float]:
    """Advantages for (group_key, return) pairs, in input order.

    Items sharing a key are estimated together with `estimator`. Items with key None, and items alone
    in their group when the estimator needs a group (see NEEDS_GROUP), are pooled and given
    `batch_baseline` over that pool. `batch_std` decides whether the pool is divided by its std;
    by default it is for GRPO, so both kinds of advantage share one scale. `reinforce` needs no
    baseline and returns every return as it is.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; expected one of {ESTIMATORS}")
    items = list(items)
    keys = [key for key, _ in items]
    returns = _checked([value for _, value in items])
    if estimator not in NEEDS_GROUP:
        return estimate(returns, estimator, eps=eps)

    groups: dict[Hashable, list[int]] = {}
    for index, key in enumerate(keys):
        if key is not None:
            groups.setdefault(key, []).append(index)

    advantages = [0.0] * len(items)
    pooled = [i for i, key in enumerate(keys) if key is None]
    for members in groups.values():
        if len(members) == 1:
            pooled.extend(members)
            continue
        for index, advantage in zip(members, estimate([returns[i] for i in members], estimator, eps=eps)):
            advantages[index] = advantage

    normalize_std = estimator == GRPO if batch_std is None else batch_std
    pooled.sort()
    pool_advantages = batch_baseline([returns[i] for i in pooled], normalize_std=normalize_std, eps=eps)
    for index, advantage in zip(pooled, pool_advantages):
        advantages[index] = advantage
    return advantages
