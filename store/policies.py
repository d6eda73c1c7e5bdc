"""Policies (trained adapters): which one is active, the list, activation and rollback.

Version 0 is the base model: it has no row and is what serves when no row is active."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from store import evaluation
from store.errors import NotFound
from store.models import Policy, PolicyStatus, utcnow

BASE_VERSION = 0


@dataclass(slots=True, frozen=True)
class ActivePolicy:
    version: int
    name: str | None  # the engine's adapter name; None for the base model
    path: str | None = None


BASE = ActivePolicy(BASE_VERSION, None)


def adapter_name(version: int) -> str:
    """The name a version is loaded under in the engine; new per version so a load never replaces one in use."""
    return f"rlproxy-v{version}"


async def active_policy(session: AsyncSession) -> ActivePolicy:
    row = (
        await session.execute(select(Policy.version, Policy.name, Policy.path).where(Policy.status == PolicyStatus.ACTIVE))
    ).first()
    return ActivePolicy(*row) if row else BASE


async def get_policy(session: AsyncSession, version: int) -> Policy:
    policy = await session.get(Policy, version)
    if policy is None:
        raise NotFound(f"policy version {version} does not exist")
    return policy


async def list_policies(session: AsyncSession, *, project: str | None = None) -> list[dict[str, Any]]:
    """Every version, the base (0) first, each with `evaluation_traffic`: the final rewards of the evaluation
    rollouts it served (store/evaluation.py; with `project`, that project's and unowned rollouts only)."""
    policies = (await session.execute(select(Policy).order_by(Policy.version))).scalars().all()
    traffic = await evaluation.traffic_by_version(session, project=project)
    none = evaluation.summarize(0, 0.0, 0.0, False)
    active = any(p.status == PolicyStatus.ACTIVE for p in policies)
    base = {"version": BASE_VERSION, "name": None, "status": "retired" if active else PolicyStatus.ACTIVE,
            "parent_version": None, "path": None, "metrics": None, "evaluation": None,
            "evaluation_traffic": traffic.get(BASE_VERSION, none), "created_at": None, "activated_at": None}
    return [base] + [
        {"version": p.version, "name": p.name, "status": p.status, "parent_version": p.parent_version,
         "path": p.path, "metrics": p.metrics, "evaluation": p.evaluation,
         "evaluation_traffic": traffic.get(p.version, none),
         "created_at": p.created_at.isoformat() if p.created_at else None,
         "activated_at": p.activated_at.isoformat() if p.activated_at else None}
        for p in policies
    ]


async def next_version(session: AsyncSession) -> int:
    return int((await session.execute(select(func.coalesce(func.max(Policy.version), 0)))).scalar_one()) + 1


async def add_candidate(
    session: AsyncSession, version: int, path: str, *, parent_version: int | None, base_model: str | None,
    metrics: dict[str, Any] | None = None,
) -> Policy:
    policy = Policy(version=version, name=adapter_name(version), parent_version=parent_version,
                    status=PolicyStatus.CANDIDATE, path=path, base_model=base_model, metrics=metrics)
    session.add(policy)
    await session.flush()
    return policy


async def set_status(session: AsyncSession, version: int, status: str, **fields: Any) -> None:
    await session.execute(update(Policy).where(Policy.version == version).values(status=status, **fields))


async def activate(session: AsyncSession, version: int) -> None:
    """Make `version` the one served (0 = the base model); the previously active one is retired."""
    if version != BASE_VERSION:
        policy = await get_policy(session, version)
        if policy.status == PolicyStatus.FAILED:
            raise NotFound(f"policy version {version} failed to load and cannot be activated")
    await session.execute(
        update(Policy).where(Policy.status == PolicyStatus.ACTIVE).values(status=PolicyStatus.RETIRED)
    )
    if version != BASE_VERSION:
        await session.flush()
        await set_status(session, version, PolicyStatus.ACTIVE, activated_at=utcnow())
