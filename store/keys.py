"""Projects, their API keys, and which project a rollout belongs to.

A key is shown once, when it is created; only its SHA-256 is stored. A plain (unsalted, fast) hash is the
right tool here because keys are 256 random bits, not passwords: nobody can guess one, so the slow, salted
hashes that protect low-entropy passwords buy nothing, while an exact-match digest can be looked up through
a unique index in one query (and costs microseconds on the request path when the cache misses).
"""
from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from store.dialect import database_now, insert_ignoring_duplicates
from store.errors import NotFound
from store.models import ApiKey, Project, Rollout, RolloutStatus, utcnow

KEY_PREFIX = "rlp_"


@dataclass(slots=True, frozen=True)
class KeyInfo:
    """What the proxy needs to know about a valid key."""

    id: str
    project: str | None  # None: the operator's key from the settings, scoped to no project
    admin: bool
    rate_limit: float | None = None
    rate_burst: int | None = None
    eval: bool = False  # made for evaluation: creates and rewards evaluation rollouts (`keys create --eval`)
    rollout: str | None = None  # a rollout's own token (store/rollout_tokens.py): good for that rollout alone
    grader: bool = False  # that rollout's grader token: its final reward, where the agent's is a claim


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)  # 256 bits of entropy


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


async def create_key(session: AsyncSession, project: str, *, admin: bool = False, label: str | None = None,
                     rate_limit: float | None = None, rate_burst: int | None = None,
                     eval: bool = False) -> tuple[str, ApiKey]:
    """A new key for `project` (created if new): the key itself — the only time it is known — and its row."""
    await session.execute(insert_ignoring_duplicates(session, Project.__table__, ["name"]),
                          [{"name": project, "created_at": utcnow()}])
    key = new_key()
    row = ApiKey(id=secrets.token_hex(6), key_hash=hash_key(key), project=project, admin=admin, label=label,
                 rate_limit=rate_limit, rate_burst=rate_burst, eval=eval, created_at=utcnow())
    session.add(row)
    await session.flush()
    return key, row


async def list_keys(session: AsyncSession, project: str | None = None) -> list[ApiKey]:
    query = select(ApiKey).order_by(ApiKey.created_at)
    if project is not None:
        query = query.where(ApiKey.project == project)
    return list((await session.execute(query)).scalars())


async def revoke_key(session: AsyncSession, key_id: str) -> ApiKey:
    row = await session.get(ApiKey, key_id)
    if row is None:
        raise NotFound(f"no key with id {key_id!r}")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
    return row


async def find_key(session: AsyncSession, key_hash: str) -> KeyInfo | None:
    """The unrevoked key with this digest, or None."""
    row = (await session.execute(
        select(ApiKey).where(ApiKey.key_hash == key_hash, ApiKey.revoked_at.is_(None))
    )).scalar_one_or_none()
    if row is None:
        return None
    return KeyInfo(row.id, row.project, row.admin, row.rate_limit, row.rate_burst, eval=row.eval)


async def count_active_keys(session: AsyncSession) -> int:
    return (await session.execute(select(func.count()).select_from(ApiKey).where(ApiKey.revoked_at.is_(None)))
            ).scalar_one()


async def rollout_owner(session: AsyncSession, rollout_id: str) -> tuple[bool, str | None]:
    """Whether `rollout_id` exists, and the project that owns it (None: no project's, open to all)."""
    owner = (await session.execute(select(Rollout.project).where(Rollout.id == rollout_id))).first()
    return (False, None) if owner is None else (True, owner[0])


async def claim_rollout(session: AsyncSession, rollout_id: str, project: str, *, task_id: str | None = None,
                        agent: str | None = None) -> str | None:
    """The project that owns `rollout_id`; a rollout nobody has created yet is created for `project` first, so
    the caller whose call is about to be recorded owns it even before that call is stored. None: a rollout
    of no project (open to all)."""
    exists, owner = await rollout_owner(session, rollout_id)
    if exists:
        return owner
    await session.execute(
        insert_ignoring_duplicates(session, Rollout.__table__, ["id"]),
        [{"id": rollout_id, "project": project, "task_id": task_id, "agent": agent,
          "status": RolloutStatus.OPEN, "call_count": 0, "created_at": await database_now(session)}],
    )
    return (await rollout_owner(session, rollout_id))[1]  # another proxy may have won the race
