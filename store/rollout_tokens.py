"""A rollout's own credentials: the token its agent is given, good for that rollout alone, and the grader token
of a rollout whose final reward its creator's program gives (`reward_source`). Both are shown once, by
`POST /rollouts`; only their SHA-256 digests are stored (`rollouts.token_hash`, `grader_token_hash`), as keys'
are (store/keys.py says why a plain hash is right for 256 random bits). A token lives as long as its rollout's
row: it still reads the rollout once it is finished or expired (the agent may look at what it was given), and
is unknown (401) once retention has deleted it."""
from __future__ import annotations

import secrets

from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from store.keys import KeyInfo, hash_key
from store.models import Rollout

ROLLOUT_TOKEN_PREFIX = "rlr_"  # the agent's: calls, events and its own rewards under one rollout
GRADER_TOKEN_PREFIX = "rlg_"  # the grader's: the rollout's final reward, where the agent's is only a claim
TOKEN_PREFIXES = (ROLLOUT_TOKEN_PREFIX, GRADER_TOKEN_PREFIX)


def new_token(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(32)  # 256 bits of entropy


def is_rollout_token(token: str) -> bool:
    """Whether `token` is shaped as a rollout's (it may still be unknown)."""
    return token.startswith(TOKEN_PREFIXES)


async def find_token(session: AsyncSession, digest: str) -> KeyInfo | None:
    """The credential whose SHA-256 is `digest`, as the proxy checks a key: the rollout it is scoped to, its
    project, and whether it is the grader's. None when no rollout holds it."""
    row = (await session.execute(
        select(Rollout.id, Rollout.project, Rollout.grader_token_hash)
        .where(or_(Rollout.token_hash == digest, Rollout.grader_token_hash == digest)))).first()
    if row is None:
        return None
    rollout_id, project, grader_hash = row
    grader = grader_hash == digest
    return KeyInfo(id=f"{'grader' if grader else 'rollout'}:{rollout_id}", project=project, admin=False,
                   rollout=rollout_id, grader=grader)


__all__ = ["GRADER_TOKEN_PREFIX", "ROLLOUT_TOKEN_PREFIX", "find_token", "hash_key", "is_rollout_token", "new_token"]
