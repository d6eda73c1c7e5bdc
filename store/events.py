"""Agent events other than rewards (Agent Lightning's `POST {AGL_EVENT_URL}` bodies: spans, messages,
anything the agent reports) kept with their rollout, in its metadata under "events", so `GET /rollouts/{id}`
shows them. A reward event is a final reward and goes through `store.rollouts.post_reward` instead."""
from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from store.models import utcnow
from store.rollouts import rollout_taking_rewards

MAX_EVENTS = 256  # per rollout: the metadata is read back with every rollout, so it stays small


async def add_event(session: AsyncSession, rollout_id: str, event_type: str, data: Any,
                    *, project: str | None = None) -> bool:
    """Append the event to the rollout's metadata; False when the rollout already holds `MAX_EVENTS` (the event
    is then only counted, so an agent that reports too much is never failed for it)."""
    rollout = await rollout_taking_rewards(session, rollout_id, project)  # locked: concurrent events all land
    metadata = dict(rollout.metadata_ or {})
    events = list(metadata.get("events") or [])
    kept = len(events) < MAX_EVENTS
    if kept:
        events.append({"event_type": event_type, "data": data, "at": utcnow().isoformat()})
        metadata["events"] = events
    else:
        metadata["events_dropped"] = int(metadata.get("events_dropped") or 0) + 1
    rollout.metadata_ = metadata  # a new dict: the JSON column sees the change
    return kept
