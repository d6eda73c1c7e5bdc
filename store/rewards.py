"""The one writer of reward rows: every kind of reward reaches the `rewards` table through here, whoever gives
it (docs/architecture.md, checked by tests/test_architecture.py).

    add_final(...)          a final reward: posted (`POST /reward`, an OTLP span) or the trainer's judge
    add_call_reward(...)    an intermediate reward for one call: posted with a call id, or an OTLP span's
    add_air(rows)           automatic rewards of recorded calls (proxy/recording/air.py), replays are no-ops
    add_air_once(row)       one automatic reward of a tool span (proxy/otlp/span_rewards.py): whether it was new
    add_claim(...)          a reward posted to a sealed rollout by someone who does not give its rewards
    check_call_rewards(...) the per-call budget (`--max-rewards-per-call`): TooManyCallRewards past it

What a reward means and whether its rollout takes it are decided by the callers (store/rollouts.py closes a
rollout, store/judging.py weighs posted rewards, the proxy scores calls); this module only writes the rows, so
their shape (kind, metadata, the AIR unique index) is kept in one place.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from store.dialect import insert_ignoring_duplicates
from store.errors import StoreError
from store.models import Reward, RewardKind, utcnow


def add_final(session: AsyncSession, rollout_id: str, value: float, *, reason: str | None = None,
              metadata: dict[str, Any] | None = None) -> None:
    """A final reward row of the rollout (its closing is the caller's: store/rollouts.py `post_reward`)."""
    session.add(Reward(rollout_id=rollout_id, kind=RewardKind.FINAL, value=value, reason=reason,
                       metadata_=metadata))


CLAIMS_KEPT = 64  # per rollout: an agent posting claims in a loop stores no more rows than this


async def add_claim(session: AsyncSession, rollout_id: str, value: float, *, call_id: str | None, giver: str,
                    metadata: dict[str, Any] | None = None) -> bool:
    """A claim (kind `claim`: final, or for `call_id`) beside the rollout's real rewards; who posted it is kept in
    `reason`. False when the rollout holds CLAIMS_KEPT already (the poster is answered, and counted, alike)."""
    held = (await session.execute(select(func.count()).select_from(Reward).where(
        Reward.rollout_id == rollout_id, Reward.kind == RewardKind.CLAIM))).scalar_one()
    if held >= CLAIMS_KEPT:
        return False
    session.add(Reward(rollout_id=rollout_id, call_id=call_id, kind=RewardKind.CLAIM, value=value, reason=giver,
                       metadata_=metadata))
    return True


def add_call_reward(session: AsyncSession, rollout_id: str, call_id: str, value: float,
                    metadata: dict[str, Any] | None = None) -> None:
    """An intermediate reward for one call of the rollout (the caller has checked the call belongs to it)."""
    session.add(Reward(rollout_id=rollout_id, call_id=call_id, kind=RewardKind.CALL, value=value,
                       metadata_=metadata))


async def has_call_reward(session: AsyncSession, call_id: str, value: float,
                          metadata: dict[str, Any] | None) -> bool:
    """Whether the call holds this very reward already (same value, same metadata): a client retrying a POST whose
    answer it lost must not make the call's credit count twice."""
    rows = (await session.execute(select(Reward.value, Reward.metadata_).where(
        Reward.call_id == call_id, Reward.kind == RewardKind.CALL))).all()
    return any(held == value and (stored or None) == (metadata or None) for held, stored in rows)


def air_row(rollout_id: str, call_id: str, value: float, reason: str, metadata: dict[str, Any]) -> dict[str, Any]:
    """The row of one automatic reward, as `add_air` and `add_air_once` take it."""
    return {"rollout_id": rollout_id, "call_id": call_id, "kind": RewardKind.AIR, "value": value, "reason": reason,
            "metadata": metadata, "created_at": utcnow()}


async def add_air(session: AsyncSession, rows: Sequence[dict[str, Any]]) -> None:
    """Automatic rewards (`air_row`s) in one statement; one the call has already for its reason is skipped (the
    `uq_rewards_air` index), so replays and re-scoring are no-ops."""
    await session.execute(insert_ignoring_duplicates(session, Reward.__table__), list(rows))


async def add_air_once(session: AsyncSession, row: dict[str, Any]) -> bool:
    """One automatic reward; False when the call has one for this reason already."""
    statement = insert_ignoring_duplicates(session, Reward.__table__).values(row).returning(Reward.__table__.c.id)
    return (await session.execute(statement)).first() is not None


async def call_rewards_held(session: AsyncSession, rollout_id: str) -> tuple[set[tuple[str, str]], Counter[str]]:
    """The rollout's per-call rewards: (trace id, span id) of the OTLP spans that gave some (replays are not stored
    twice), and how many each call holds (bounded by --max-rewards-per-call)."""
    rows = (await session.execute(select(Reward.call_id, Reward.metadata_).where(
        Reward.rollout_id == rollout_id, Reward.kind == RewardKind.CALL))).all()
    spans = {(m["trace_id"], m["span_id"]) for _, m in rows
             if isinstance(m, dict) and m.get("source") == "otlp" and "trace_id" in m and "span_id" in m}
    return spans, Counter(call_id for call_id, _ in rows)


class TooManyCallRewards(StoreError):
    """A call holds the most per-call rewards it may keep (`--max-rewards-per-call`); the reward is not stored.
    Every reward row is read back with its rollout, by the trainer and by `GET /rollouts/{id}`, so an agent that
    sends thousands for one call would make every later read of the rollout pay for them; a call needs a handful.
    The proxy answers it 413 (a posted reward) or as a rejected span (an OTLP export)."""

    def __init__(self, call_id: str, limit: int) -> None:
        super().__init__(f"call {call_id[:128]!r} holds {limit} per-call rewards already, the most kept")
        self.limit = limit


async def check_call_rewards(session: AsyncSession, call_id: str, limit: int) -> None:
    """TooManyCallRewards when the call holds more than `limit` per-call rewards, counting those the transaction
    added and has not committed; call it after adding, with the rollout locked, so concurrent rewards count."""
    await session.flush()
    if await call_reward_count(session, call_id) > limit:
        raise TooManyCallRewards(call_id, limit)


async def call_reward_count(session: AsyncSession, call_id: str) -> int:
    """How many per-call rewards the call holds, those this transaction added included."""
    return (await session.execute(select(func.count()).select_from(Reward)
                                  .where(Reward.call_id == call_id, Reward.kind == RewardKind.CALL))).scalar_one()
