"""Agent events other than rewards (Agent Lightning's `POST {AGL_EVENT_URL}` bodies: spans, messages, anything
the agent reports) kept with their rollout, one row each (`rollout_events`), so `GET /rollouts/{id}` shows them
in its metadata under "events", as it always has. A reward event is a final reward and goes through
`store.rollouts.post_reward` instead.

Before migration 0008 events were appended to the rollout's metadata itself; those are read back first and
count towards the rollout's budget like the rows."""
from __future__ import annotations

from typing import Any

from sqlalchemy import String, func, insert, literal, select
from sqlalchemy.ext.asyncio import AsyncSession

from store.errors import StoreError
from store.models import Document, RolloutEvent, Timestamp, utcnow
from store.rollout_view import metadata_events
from store.rollouts import rollout_taking_rewards


class TooManyEvents(StoreError):
    """The rollout holds the most events it may keep; the event was not stored."""

    def __init__(self, rollout_id: str, limit: int) -> None:
        super().__init__(f"rollout {rollout_id!r} holds {limit} events already, the most kept; "
                         f"earlier events are kept")
        self.limit = limit


async def add_event(session: AsyncSession, rollout_id: str, event_type: str, data: Any, *, max_events: int,
                    project: str | None = None) -> None:
    """Append the event as a row of its own; `TooManyEvents` when the rollout holds `max_events` already. The
    count and the insert are one statement, so concurrent events cannot overshoot even where the row lock
    taken first is a no-op (SQLite)."""
    rollout = await rollout_taking_rewards(session, rollout_id, project)
    room = max_events - len(metadata_events(rollout))
    held = (select(func.count()).select_from(RolloutEvent).where(RolloutEvent.rollout_id == rollout_id)
            .scalar_subquery())
    row = select(literal(rollout_id, String()), literal(event_type, String()), literal(data, Document),
                 literal(utcnow(), Timestamp)).where(held < room)
    added = await session.execute(
        insert(RolloutEvent).from_select(["rollout_id", "event_type", "data", "created_at"], row))
    if added.rowcount != 1:
        raise TooManyEvents(rollout_id, max_events)
