"""Policies (trained adapters): which version of each named policy is active, the list, activation and rollback.

A named policy (`default` unless the proxy's routing rules name others) is a line of versions; versions are
numbered across all policies. Version 0 is the base model: it has no row and is what serves a policy that has
no active row."""
from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from core.policy_rules import BASE_POLICY, DEFAULT_POLICY
from store import evaluation, verdicts
from store.errors import ActiveChanged, Conflict, NotFound
from store.models import Policy, PolicyStatus, utcnow

BASE_VERSION = 0
UNDER_EVALUATION = (PolicyStatus.CANDIDATE, PolicyStatus.CANARY)  # a gate may still make these serve


class WeightsRemoved(Conflict):
    """The version's adapter folder was removed by the trainer's retention (trainer/retention.py): it can no
    longer be loaded, so it cannot serve again."""

    def __init__(self, version: int) -> None:
        super().__init__(f"policy version {version} cannot be activated: its adapter folder was removed (the "
                         "trainer keeps the active version, its parent, candidates and the newest keep_versions; "
                         "GET /policies shows weights_kept)")

__all__ = ["BASE_POLICY", "DEFAULT_POLICY", "BASE", "BASE_VERSION", "ActivePolicy"]


@dataclass(slots=True, frozen=True)
class ActivePolicy:
    version: int
    name: str | None  # the engine's adapter name; None for the base model
    path: str | None = None
    policy: str = DEFAULT_POLICY  # the named policy this version belongs to


BASE = ActivePolicy(BASE_VERSION, None)


def base_of(policy: str) -> ActivePolicy:
    """What serves `policy` before any version of it is active: the base model."""
    return ActivePolicy(BASE_VERSION, None, None, policy)


def adapter_name(version: int) -> str:
    """A new name for a version to be loaded under in the engine (kept in its row: read `Policy.name`, never
    make it again). New per version, so a load never replaces one in use; and with a random part, so two
    deployments (two databases) sharing an engine never name two adapters alike: with `rlproxy-vN` alone, each
    one's restore loop took the other's v3 for its own with the wrong weights and loaded it again, so agents
    were served and recorded under the other deployment's weights, and under that churn vLLM crashed."""
    return f"rlproxy-v{version}-{secrets.token_hex(4)}"


async def active_policy(session: AsyncSession, policy: str = DEFAULT_POLICY) -> ActivePolicy:
    row = (await session.execute(
        select(Policy.version, Policy.name, Policy.path, Policy.policy)
        .where(Policy.status == PolicyStatus.ACTIVE, Policy.policy == policy))).first()
    return ActivePolicy(*row) if row else base_of(policy)


async def policy_of(session: AsyncSession, version: int) -> str:
    """The named policy a version belongs to (the base model, 0, belongs to none: the default is answered)."""
    if version == BASE_VERSION:
        return DEFAULT_POLICY
    return (await get_policy(session, version)).policy


async def lineage(session: AsyncSession, policy: str) -> dict[int, int]:
    """version -> its position in `policy`'s line (the base model 0, its first version 1, ...): how far apart
    two versions of one policy are, whatever other policies were trained in between."""
    versions = (await session.execute(
        select(Policy.version).where(Policy.policy == policy).order_by(Policy.version))).scalars().all()
    return {BASE_VERSION: 0, **{version: position for position, version in enumerate(versions, start=1)}}


async def unpublished_versions(session: AsyncSession, policy: str, after_version: int) -> list[Policy]:
    """`policy`'s candidates and canaries newer than `after_version`, oldest first: versions a trainer recorded
    but stopped before it published them (or while their canary ran)."""
    return list((await session.execute(
        select(Policy).where(Policy.status.in_((PolicyStatus.CANDIDATE, PolicyStatus.CANARY)),
                             Policy.policy == policy, Policy.version > after_version)
        .order_by(Policy.version))).scalars().all())


async def get_policy(session: AsyncSession, version: int) -> Policy:
    policy = await session.get(Policy, version)
    if policy is None:
        raise NotFound(f"policy version {version} does not exist")
    return policy


async def list_policies(session: AsyncSession, *, project: str | None = None,
                        policy: str = DEFAULT_POLICY) -> list[dict[str, Any]]:
    """The versions of `policy`, the base (0) first, each with `evaluation_traffic`: the final rewards of the
    evaluation rollouts it served (store/evaluation.py; with `project`, that project's and unowned rollouts
    only). The base model's status is `active` when `policy` has no active version. A project's key sees
    neither a version's folder on the trainer's disk nor its step metrics (a shared policy's batches hold other
    projects' rollouts: their rewards, counts and skips)."""
    policies = (await session.execute(
        select(Policy).where(Policy.policy == policy).order_by(Policy.version))).scalars().all()
    traffic = await evaluation.traffic_by_version(session, project=project)
    judged = await verdicts.evaluations(session, [p.version for p in policies])
    none = evaluation.summarize(0, 0.0, 0.0, False)
    active = any(p.status == PolicyStatus.ACTIVE for p in policies)
    base = {"version": BASE_VERSION, "policy": policy, "name": None,
            "status": "retired" if active else PolicyStatus.ACTIVE,
            "parent_version": None, "path": None, "metrics": None, "evaluation": None,
            "evaluation_traffic": traffic.get(BASE_VERSION, none), "weights_kept": True, "agreement": None,
            "created_at": None,
            "activated_at": None}
    return [base] + [
        {"version": p.version, "policy": p.policy, "name": p.name, "status": p.status,
         "parent_version": p.parent_version,
         "path": p.path if project is None else None, "metrics": p.metrics if project is None else None,
         "evaluation": _evaluation(p, judged.get(p.version)),
         "evaluation_traffic": traffic.get(p.version, none),
         "weights_kept": p.weights_kept,
         "agreement": (p.metrics or {}).get("served_agreement"),
         "created_at": p.created_at.isoformat() if p.created_at else None,
         "activated_at": p.activated_at.isoformat() if p.activated_at else None}
        for p in policies
    ]


def _evaluation(policy: Policy, judged: dict[str, Any] | None) -> dict[str, Any] | None:
    """A version's `evaluation` as `GET /policies` has always shown it: its verdicts (store/verdicts.py) beside
    what else its row keeps there (the fleet's reference answer); None when there is neither."""
    return {**(policy.evaluation or {}), **(judged or {})} or None


async def evaluation_of(session: AsyncSession, version: int) -> dict[str, Any] | None:
    """One version's `evaluation`, as `list_policies` shows it."""
    policy = await get_policy(session, version)
    return _evaluation(policy, (await verdicts.evaluations(session, [version])).get(version))


async def names(session: AsyncSession) -> list[str]:
    """Every named policy that has a version, in name order."""
    return sorted((await session.execute(select(Policy.policy).distinct())).scalars())


async def adapter_policies(session: AsyncSession, adapters: list[str]) -> dict[str, str]:
    """The named policy of each of these adapter names that is a version (other names are left out)."""
    rows = await session.execute(select(Policy.name, Policy.policy).where(Policy.name.in_(adapters)))
    return {name: policy for name, policy in rows}


async def next_version(session: AsyncSession) -> int:
    return int((await session.execute(select(func.coalesce(func.max(Policy.version), 0)))).scalar_one()) + 1


async def add_candidate(
    session: AsyncSession, version: int, path: str, *, parent_version: int | None, base_model: str | None,
    metrics: dict[str, Any] | None = None, policy: str = DEFAULT_POLICY,
) -> Policy:
    if policy == BASE_POLICY:
        raise ValueError(f"{BASE_POLICY!r} is the base model's policy and has no versions")
    row = Policy(version=version, name=adapter_name(version), policy=policy, parent_version=parent_version,
                 status=PolicyStatus.CANDIDATE, path=path, base_model=base_model, metrics=metrics)
    session.add(row)
    await session.flush()
    return row


async def record_agreement(session: AsyncSession, version: int, agreement: dict[str, Any]) -> None:
    """Keep how well the engines' log-probs of the calls `version` served agreed with the trainer's of it
    (trainer/agreement.py) in the version's metrics, where `GET /policies` shows it as `agreement`. The base
    model (0) has no row: its agreement is in the step records only."""
    row = await session.get(Policy, version)
    if row is not None:
        row.metrics = {**(row.metrics or {}), "served_agreement": agreement}


async def retire_unserved(session: AsyncSession, version: int) -> str | None:
    """Retire `version` if it is still a candidate or a canary (a gate kept it out); None when it was, else the
    status it has now (an operator activated it meanwhile: it stays as they left it)."""
    done = await session.execute(update(Policy).where(
        Policy.version == version, Policy.status.in_([PolicyStatus.CANDIDATE, PolicyStatus.CANARY]))
        .values(status=PolicyStatus.RETIRED))
    if done.rowcount:
        return None
    return (await session.execute(select(Policy.status).where(Policy.version == version))).scalar_one_or_none()


async def set_status(session: AsyncSession, version: int, status: str, **fields: Any) -> None:
    await session.execute(update(Policy).where(Policy.version == version).values(status=status, **fields))


async def activate(session: AsyncSession, version: int, policy: str = DEFAULT_POLICY, *,
                   replacing: int | None = None) -> None:
    """Make `version` the one its policy serves (0: `policy` goes back to the base model); the version of
    that policy that was active is retired. `replacing`: only if that version is the one active now (0: none),
    else `ActiveChanged` (a Conflict) and nothing changes: a trainer publishing what it trained from v7 must not undo an
    operator's rollback to v3 made while it trained."""
    if version != BASE_VERSION:
        row = await get_policy(session, version)
        if row.status == PolicyStatus.FAILED:
            raise NotFound(f"policy version {version} failed to load and cannot be activated")
        if not row.weights_kept:
            raise WeightsRemoved(version)
        policy = row.policy
    retired = list((await session.execute(
        update(Policy).where(Policy.status == PolicyStatus.ACTIVE, Policy.policy == policy)
        .values(status=PolicyStatus.RETIRED).returning(Policy.version)
    )).scalars())
    if replacing is not None and (retired[0] if retired else BASE_VERSION) != replacing:
        active = retired[0] if retired else BASE_VERSION
        raise ActiveChanged(f"policy {policy!r} serves v{active} now, not v{replacing} (activated while v{version} was "
                       f"trained from v{replacing}); v{version} is not made active")
    if version != BASE_VERSION:
        await session.flush()
        await set_status(session, version, PolicyStatus.ACTIVE, activated_at=utcnow())


async def with_weights(session: AsyncSession) -> list[Policy]:
    """Every version whose adapter folder the trainer has not removed, oldest first (trainer/retention.py)."""
    return list((await session.execute(
        select(Policy).where(Policy.weights_kept).order_by(Policy.version))).scalars().all())


async def mark_weights_removed(session: AsyncSession, versions: list[int]) -> None:
    """Their folders are gone: `GET /policies` says so, and activating one is refused (WeightsRemoved)."""
    if versions:
        await session.execute(update(Policy).where(Policy.version.in_(versions)).values(weights_kept=False))
