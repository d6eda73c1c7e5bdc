"""Evaluation traffic: the final rewards of rollouts marked `eval` (never trained on), per policy version that
served them (`rollouts.policy_version`), with a 95% confidence interval on the mean.

The interval: when every reward is 0 or 1 it is a success rate and gets Wilson's score interval (it stays
inside [0, 1] and is not zero-width at 0 or n successes); otherwise Student's t interval on the mean,
mean ± t(0.975, n-1) · s / sqrt(n) with s the sample standard deviation (none for a single rollout)."""
from __future__ import annotations

import math
from typing import Any

from sqlalchemy import case, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from store.models import Rollout, RolloutStatus
from store.reward_sources import RewardedBy

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile
# Student's t 97.5% quantiles for 1..30 degrees of freedom; beyond, the Cornish-Fisher series (below).
_T975 = (12.706204736, 4.302652730, 3.182446305, 2.776445105, 2.570581836, 2.446911851, 2.364624252,
         2.306004135, 2.262157163, 2.228138852, 2.200985160, 2.178812830, 2.160368656, 2.144786688,
         2.131449546, 2.119905299, 2.109815578, 2.100922040, 2.093024054, 2.085963447, 2.079613845,
         2.073873068, 2.068657610, 2.063898562, 2.059538553, 2.055529439, 2.051830516, 2.048407142,
         2.045229642, 2.042272456)


def t975(df: int) -> float:
    """Student's t distribution's 97.5% quantile with `df` degrees of freedom (error < 1e-6)."""
    if df < 1:
        raise ValueError("degrees of freedom must be at least 1")
    if df <= len(_T975):
        return _T975[df - 1]
    z = Z95
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
            + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * df**4))


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a success rate: unlike p ± z·se it stays inside [0, 1] and is not
    zero-width at 0 or n successes, which is where small evaluations often land. No trials: (0, 1)."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(max(0.0, p * (1 - p) / n + z * z / (4 * n * n))) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def summarize(n: int, total: float, squares: float, binary: bool) -> dict[str, Any]:
    """`{"n", "mean", "ci95": [lo, hi] | None, "interval": "wilson" | "t" | None}` from the count, sum and
    sum of squares of the rewards, and whether all of them are 0 or 1."""
    if n == 0:
        return {"n": 0, "mean": None, "ci95": None, "interval": None}
    mean = total / n
    if binary:
        return {"n": n, "mean": mean, "ci95": list(wilson(total, n)), "interval": "wilson"}
    if n == 1:
        return {"n": 1, "mean": mean, "ci95": None, "interval": "t"}
    variance = max(0.0, (squares - n * mean * mean) / (n - 1))
    half = t975(n - 1) * math.sqrt(variance / n)
    return {"n": n, "mean": mean, "ci95": [mean - half, mean + half], "interval": "t"}


async def traffic_by_version(session: AsyncSession, *, project: str | None = None) -> dict[int, dict[str, Any]]:
    """Policy version → summary of the final rewards of the finished evaluation rollouts it served, those an
    evaluation credential rewarded (the grader token, an admin or evaluation key, the operator key; never an
    agent's or a plain project key's: `rollouts.rewarded_by`). With
    `project`, only that project's rollouts (and those of no project) count, as a project's key sees them."""
    reward = Rollout.reward
    query = (
        select(Rollout.policy_version, func.count(), func.sum(reward), func.sum(reward * reward),
               func.sum(case((or_(reward == 0, reward == 1), 1), else_=0)))
        .where(Rollout.eval, Rollout.status == RolloutStatus.FINISHED, Rollout.policy_version.is_not(None),
               reward.is_not(None), Rollout.rewarded_by.in_(RewardedBy.EVIDENCE))
        .group_by(Rollout.policy_version)
    )
    if project is not None:
        query = query.where(or_(Rollout.project.is_(None), Rollout.project == project))
    return {int(version): summarize(int(n), float(total), float(squares), int(binary) == int(n))
            for version, n, total, squares, binary in await session.execute(query)}
