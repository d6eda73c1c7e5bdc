"""The traffic canary: a candidate policy answers a fixed fraction of new rollouts until a judge promotes or
retires it.

Which rollouts it answers is a pure function of the rollout id (a SHA-256 bucket), so every call of a
rollout goes to the same version without any per-rollout state, and every proxy sharing the database agrees.
The canary itself is the policy row with status `canary`; its fraction and start time live in its newest
`canary` verdict (store/verdicts.py), which the proxies read on their policy refresh. The proxy and the trainer
both use this module: the proxy to route, the trainer to start the canary, gather the evidence and end it.

Each named policy has at most one canary; it answers that policy's calls only, and is judged against that
policy's active version.

A canary has a scope (`traffic`): "all" answers its share of every new rollout and is judged on them (the
`canary` gate); "eval" answers its share of evaluation rollouts only — those created with `eval`, sent with
`X-Rlproxy-Eval: 1`, or of an agent named in its record's `eval_agents` — and is judged on those alone (the
`eval-traffic` gate), so a candidate is proven on the user's evaluation traffic before any production
rollout sees it.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from core.policy_rules import DEFAULT_POLICY
from store import policies, verdicts
from store.errors import Conflict
from store.models import Call, Policy, PolicyStatus, Rollout, RolloutStatus, as_utc, utcnow
from store.reward_sources import RewardedBy

ALL, EVAL = "all", "eval"  # the canary's scope: every new rollout, or evaluation rollouts only


@dataclass(slots=True, frozen=True)
class Canary:
    version: int
    name: str
    fraction: float  # of new rollouts, in (0, 1)
    started_at: datetime
    parent: int | None  # the version that was active when the canary started
    traffic: str = ALL  # ALL or EVAL (module docstring)
    eval_agents: tuple[str, ...] = ()  # with EVAL: agents whose rollouts are evaluation traffic by name
    policy: str = DEFAULT_POLICY  # the named policy whose calls it answers a share of

    def answers(self, rollout_id: str, evaluation: bool) -> bool:
        """Whether this canary answers a call of `rollout_id` (an evaluation rollout or not)."""
        return (evaluation or self.traffic == ALL) and serves(self, rollout_id)


def serves(canary: Canary, rollout_id: str) -> bool:
    """Whether the canary answers this rollout. Salted with the version, so successive canaries see
    different rollouts; the same id and canary always give the same answer, in every process."""
    digest = hashlib.sha256(f"{canary.version}:{rollout_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < canary.fraction * 2**64


def _parse(version: int, name: str, record: dict[str, Any] | None,
           policy: str = DEFAULT_POLICY) -> Canary | None:
    """The canary a `canary` verdict record describes (store/verdicts.py as_record)."""
    record = record or {}
    try:
        fraction = float(record["fraction"])
        started = datetime.fromisoformat(record["started_at"])
    except (KeyError, TypeError, ValueError):
        return None  # a canary row without a readable record answers nothing (it is still judged)
    traffic = EVAL if record.get("traffic") == EVAL else ALL
    return Canary(version, name, min(max(fraction, 0.0), 1.0), started, record.get("parent"), traffic,
                  tuple(str(a) for a in record.get("eval_agents") or ()), policy)


@dataclass(slots=True, frozen=True)
class Line:
    """What serves one named policy: its active version (or the base model) and its canary, if one runs."""
    active: policies.ActivePolicy
    canary: Canary | None = None


async def serving_all(session: AsyncSession) -> dict[str, Line]:
    """Every named policy with an active version or a canary, in one read (a policy not in it is served by
    the base model)."""
    rows = (await session.execute(
        select(Policy.version, Policy.name, Policy.path, Policy.status, Policy.policy)
        .where(Policy.status.in_((PolicyStatus.ACTIVE, PolicyStatus.CANARY))).order_by(Policy.version)
    )).all()
    started = await verdicts.newest(session, [row.version for row in rows if row.status == PolicyStatus.CANARY],
                                    verdicts.CANARY)
    lines: dict[str, Line] = {}
    for version, name, path, status, policy in rows:
        line = lines.get(policy) or Line(policies.base_of(policy))
        if status == PolicyStatus.ACTIVE:
            line = Line(policies.ActivePolicy(version, name, path, policy), line.canary)
        else:  # the newest readable canary
            record = verdicts.as_record(started[version]) if version in started else None
            line = Line(line.active, _parse(version, name, record, policy) or line.canary)
        lines[policy] = line
    return lines


async def serving(session: AsyncSession, policy: str = DEFAULT_POLICY) -> tuple[policies.ActivePolicy, Canary | None]:
    """`policy`'s active version and its running canary (if any), in one read."""
    line = (await serving_all(session)).get(policy) or Line(policies.base_of(policy))
    return line.active, line.canary


async def running(session: AsyncSession, policy: str = DEFAULT_POLICY) -> Canary | None:
    return (await serving(session, policy))[1]


async def start(session: AsyncSession, version: int, fraction: float, *, traffic: str = ALL,
                eval_agents: tuple[str, ...] | list[str] = ()) -> Canary:
    """Put `version` (a loaded candidate) in canary over `traffic` of its policy's calls. Idempotent for the
    canary already running (a restarted trainer resumes judging it with its original start); another canary of
    the same policy running is a Conflict."""
    if traffic not in (ALL, EVAL):
        raise ValueError(f"canary traffic must be {ALL!r} or {EVAL!r}, not {traffic!r}")
    if not 0 < fraction < 1:
        raise ValueError(f"canary fraction must be between 0 and 1, not {fraction}")
    policy = await policies.get_policy(session, version)
    current = await running(session, policy.policy)
    if current is not None and current.version != version:
        raise Conflict(f"policy v{current.version} is already in canary for {policy.policy!r}")
    if policy.status == PolicyStatus.CANARY and current is not None:
        return current
    if policy.status not in (PolicyStatus.CANDIDATE, PolicyStatus.CANARY):
        raise Conflict(f"policy v{version} is {policy.status}; only a candidate can go in canary")
    active = await policies.active_policy(session, policy.policy)
    row = await verdicts.add(session, version, verdicts.CANARY, parent_version=active.version, evidence={
        "fraction": fraction, "started_at": utcnow().isoformat(), "traffic": traffic,
        "eval_agents": list(eval_agents)})
    await policies.set_status(session, version, PolicyStatus.CANARY)
    return _parse(version, policy.name, verdicts.as_record(row), policy.policy)


@dataclass(slots=True, frozen=True)
class Arm:
    version: int
    rollouts: int
    mean_reward: float | None


async def evidence(session: AsyncSession, canary: Canary, versions: tuple[int, ...]) -> dict[int, Arm]:
    """Finished rollouts created since the canary started, by the one version that answered all their calls
    (with an EVAL canary: evaluation rollouts only). A rollout whose calls span versions (it was under way when
    the canary started or a proxy had not yet refreshed) and one with no call of the canary's policy are left
    out: their reward says nothing about a single version. Calls of other policies in the same rollout (another
    agent role's) do not count either way."""
    # evaluation evidence is what an evaluation credential rewarded: never a reward a project key or an agent gave
    scope = [Rollout.eval, Rollout.rewarded_by.in_(RewardedBy.EVIDENCE)] if canary.traffic == EVAL else []
    per_rollout = (
        select(Rollout.reward.label("reward"), func.min(Call.policy_version).label("version"))
        .join(Call, Call.rollout_id == Rollout.id)
        .where(Rollout.status == RolloutStatus.FINISHED, Rollout.created_at >= as_utc(canary.started_at),
               Call.policy_version.is_not(None), Call.policy == canary.policy, *scope)
        .group_by(Rollout.id, Rollout.reward)
        .having(func.min(Call.policy_version) == func.max(Call.policy_version))
        .subquery()
    )
    rows = (await session.execute(
        select(per_rollout.c.version, func.count(), func.avg(per_rollout.c.reward))
        .where(per_rollout.c.version.in_(versions)).group_by(per_rollout.c.version)
    )).all()
    arms = {v: Arm(v, 0, None) for v in versions}
    for version, count, mean in rows:
        arms[version] = Arm(version, int(count), float(mean))
    return arms


async def end(session: AsyncSession, canary: Canary, promoted: bool, *, mine: Arm, theirs: Arm,
              margin: float) -> None:
    """Promote (make it the active policy) or retire the canary, recording the verdict: its arm against the
    active version's `theirs`, with the margin the rule allowed."""
    await verdicts.add(
        session, canary.version, verdicts.CANARY, score=mine.mean_reward, parent_version=canary.parent,
        parent_score=theirs.mean_reward, promoted=promoted, evidence={
            "fraction": canary.fraction, "started_at": canary.started_at.isoformat(), "traffic": canary.traffic,
            "eval_agents": list(canary.eval_agents), "rollouts": mine.rollouts, "active_version": theirs.version,
            "active_rollouts": theirs.rollouts, "margin": margin, "ended_at": utcnow().isoformat()})
    if promoted:
        await policies.activate(session, canary.version)
    else:
        await policies.set_status(session, canary.version, PolicyStatus.RETIRED)


