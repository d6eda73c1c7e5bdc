"""How many per-call rewards one recorded call may hold (`--max-rewards-per-call`). Every reward row is read
back with its rollout, by the trainer and by `GET /rollouts/{id}`, so an agent that sends thousands for one call
makes every later read of the rollout pay for them; a call needs a handful. Checked where rewards come in:
`POST /reward` with a call id and the spans of an OTLP export (proxy/span_rewards.py)."""
from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from proxy.errors import PayloadTooLarge
from store import rewards as reward_rows


def over_budget_message(call_id: str, limit: int) -> str:
    return (f"call {call_id[:128]!r} holds {limit} per-call rewards already, the most kept "
            f"(--max-rewards-per-call)")


async def check_call_rewards(session: AsyncSession, call_id: str, limit: int) -> None:
    """PayloadTooLarge when the call holds more than `limit` per-call rewards, counting those the transaction
    added and has not committed; call it after adding, with the rollout locked, so concurrent rewards count."""
    await session.flush()
    held = await reward_rows.call_reward_count(session, call_id)
    if held > limit:
        raise PayloadTooLarge(over_budget_message(call_id, limit), code="too_many_rewards")
