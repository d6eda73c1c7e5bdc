"""`POST /rollouts/{rollout_id}/events`: the event URL an Agent Lightning v1 agent is given (`AGL_EVENT_URL`),
so such an agent runs against the proxy unchanged. Its body is `{"event_type": str, "data": object}`:
a `reward` event (`data.value`, a finite number) is the rollout's final reward, exactly as `POST /reward`
without `call_id` (same no-op on a repeat, 409 for a different value); any other event is kept with the
rollout (a row of its own, shown in its metadata's "events" by `GET /rollouts/{id}`). Same keys and tenancy as
`POST /reward`. Bounded: a body over `--max-event-bytes` is 413 before it is read, and an event past the
rollout's `--max-rollout-events` is 413 with the earlier ones kept (reward events are not counted)."""
from __future__ import annotations

from typing import Any, ClassVar

from aiohttp import web
from pydantic import Field, StrictStr, field_validator

from core.checks import reward_problem
from proxy.bodies import Body
from proxy.api import Answer, Endpoint, read_bounded, rollout_in_path
from proxy.edge import reward_giver
from proxy.errors import PayloadTooLarge, Unprocessable
from proxy.schemas import _Stored, parse_json_object, validate
from proxy.state import state
from proxy.strict_json import MAX_JSON_DEPTH, too_deep

REWARD = "reward"


class RolloutEvent(_Stored):
    event_type: StrictStr = Field(min_length=1, max_length=128,
                                  description='"reward" (data.value is the final reward) or any other kind.')
    data: Any = Field(default_factory=dict, description=f"Any JSON (nested at most {MAX_JSON_DEPTH} levels); a "
                                                        "reward event's is an object with `value`.")

    @field_validator("data")
    @classmethod
    def _shallow(cls, data: Any) -> Any:
        if too_deep(data):  # the store's JSON encoder gives up past 254 levels (a 500 otherwise)
            raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
        return data


class EventResult(Body):
    omit_unset: ClassVar[bool] = True  # claim only for a reward kept as a claim

    rollout_id: str
    event_type: str
    reward: float | None = Field(None, description="The final reward stored (reward events only).")
    stored: bool = Field(description="Always true: an event that cannot be kept is refused with 413 instead.")
    claim: bool | None = Field(None, description="True when the reward event was kept as a claim: the rollout's "
                                                "grader gives its reward (docs/security.md).")


def _reward_value(data: Any) -> float:
    value = data.get("value") if isinstance(data, dict) else None
    if problem := reward_problem(value):
        raise Unprocessable(f"a reward event needs data.value: {problem}", param="data.value")
    return float(value)


async def post_event(request: web.Request) -> web.Response:
    rollout_id = rollout_in_path(request)
    app = state(request)
    limit = app.settings.ingest.max_event_bytes
    raw = await read_bounded(request, limit, lambda size: _too_large(size, limit))
    event = validate(RolloutEvent, parse_json_object(raw, Unprocessable), Unprocessable)
    project, ingest = request.get("project"), app.ingest
    if event.event_type == REWARD:  # as POST /reward without call_id
        result = await ingest.reward(rollout_id, _reward_value(event.data), project=project,
                                     metadata={"event": REWARD}, giver=reward_giver(request, rollout_id))
        claim = {"claim": True} if result.claim else {}
        return EventResult(rollout_id=rollout_id, event_type=REWARD, reward=result.reward, stored=True,
                           **claim).reply()
    await ingest.event(rollout_id, event.event_type, event.data, project=project)
    return EventResult(rollout_id=rollout_id, event_type=event.event_type, reward=None, stored=True).reply()


def _too_large(size: int | None, limit: int) -> PayloadTooLarge:
    size_text = f"more than {limit}" if size is None else str(size)
    return PayloadTooLarge(f"the event is {size_text} bytes; an event may be at most {limit} (--max-event-bytes)",
                           code="event_too_large")


ENDPOINTS = [
    Endpoint("post", "/rollouts/{rollout_id}/events", post_event,
             "An agent event (Agent Lightning's event URL): a reward event is the final reward, others are kept "
             "with the rollout", {200: Answer("Stored (or the same final reward again).", EventResult)},
             (404, 409, 413, 422, 503), body=RolloutEvent, path_params={"rollout_id": {"type": "string"}}),
]
