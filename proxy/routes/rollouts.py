"""Rollouts and rewards: `POST /rollouts`, `POST /reward`, `GET /rollouts/{rollout_id}` (paged by count and by
bytes: `?limit=N&after=SEQ`; `?calls=false` for the summary alone; store/rollout_view.py)."""
from __future__ import annotations

import asyncio

import orjson
from aiohttp import web

from proxy.bodies import RewardResult, Rollout, RolloutClosed, RolloutCreated
from proxy.api import Answer, Endpoint, query_flag, query_number, read_bounded, rollout_in_path
from proxy.edge import may_create_eval, own_rollout, reward_giver
from proxy.errors import Forbidden, PayloadTooLarge, Unprocessable
from proxy.schemas import RewardPost, RolloutClose, RolloutCreate, parse_json_object, validate
from proxy.state import state
from store import rollouts as store_rollouts
from store.rollout_view import MAX_PAGE, PAGE_BYTES


async def read_rollout_body(request: web.Request) -> bytes:
    """The body of POST /rollouts, POST /reward or a rollout's close: what it holds is kept with the rollout (its
    metadata), so it is bounded far below what a chat call may send."""
    limit = state(request).settings.ingest.max_rollout_body_bytes
    return await read_bounded(request, limit, lambda size: PayloadTooLarge(
        f"the request body is {'more than ' + str(limit) if size is None else size} bytes; this route takes at most "
        f"{limit} (--max-rollout-body-bytes)", code="rollout_body_too_large"))


async def create_rollout(request: web.Request) -> web.Response:
    raw = await read_rollout_body(request)
    body = validate(RolloutCreate, parse_json_object(raw, Unprocessable) if raw.strip() else {}, Unprocessable)
    if body.eval and not may_create_eval(request):
        raise Forbidden("eval: evaluation rollouts are created by the operator key, an admin key of the project or "
                        "a key made for evaluation (rlproxy keys create --project P --eval); this key may create "
                        "training rollouts only", param="eval", code="eval_needs_eval_key")
    opened = await state(request).ingest.open(body, project=request.get("project"))
    base_url = f"{request.url.origin()}/rollouts/{opened.rollout_id}/v1"
    return RolloutCreated(rollout_id=opened.rollout_id, base_url=base_url, token=opened.token,
                          reward_source=opened.reward_source, grader_token=opened.grader_token).reply(status=201)


async def post_reward(request: web.Request) -> web.Response:
    body = validate(RewardPost, parse_json_object(await read_rollout_body(request), Unprocessable), Unprocessable)
    own_rollout(request, body.rollout_id)
    result = await state(request).ingest.reward(body.rollout_id, body.reward, project=request.get("project"),
                                                call_id=body.call_id, task_id=body.task_id, metadata=body.metadata,
                                                giver=reward_giver(request, body.rollout_id))
    extra = {"call_id": result.call_id} if result.call_id is not None else {}
    if result.claim:
        extra["claim"] = True
    return RewardResult(rollout_id=result.rollout_id, reward=result.reward, **extra).reply()


async def close_rollout(request: web.Request) -> web.Response:
    """The agent is done and no final reward is coming from it: the rollout closes as its idle timeout would close it
    (a policy with a teacher trains it from the teacher; docs/distillation.md)."""
    raw = await read_rollout_body(request)
    validate(RolloutClose, parse_json_object(raw, Unprocessable) if raw.strip() else {}, Unprocessable)
    rollout_id = rollout_in_path(request)
    own_rollout(request, rollout_id)
    result = await state(request).ingest.close(rollout_id, project=request.get("project"),
                                               giver=reward_giver(request, rollout_id))
    return RolloutClosed(rollout_id=result.rollout_id, status=result.status, closed=result.closed,
                         claim=result.claim).reply()


async def get_rollout(request: web.Request) -> web.Response:
    rollout_id = rollout_in_path(request)
    limit = query_number(request, "limit", int, 1, MAX_PAGE, error=Unprocessable)
    after = query_number(request, "after", int, 0, error=Unprocessable)
    with_calls = query_flag(request, "calls", error=Unprocessable) is not False
    app = state(request)
    await app.writer.sync()
    # A page ends at PAGE_BYTES of stored calls too, as the web view's does: 24 calls of 4 MB were one 92 MiB
    # answer, and two such reads at once held 365 MB of the proxy's memory.
    async with app.sessions() as session:
        rollout = await store_rollouts.get_rollout(session, rollout_id, project=request.get("project"),
                                                   limit=limit, after=after, max_bytes=PAGE_BYTES,
                                                   with_calls=with_calls)
    # A page can be tens of MiB of JSON: written in a worker thread, by orjson alone. The store builds the
    # contract's shape (`Rollout`, which tests/api/test_openapi.py checks answers against); validating it again here
    # would hold the interpreter lock, and so the event loop, for a quarter of a second per 1,000 calls.
    return web.Response(body=await asyncio.to_thread(orjson.dumps, rollout), content_type="application/json")


ENDPOINTS = [
    Endpoint("post", "/rollouts", create_rollout, "Start a rollout; its base_url records every call made through it",
             {201: Answer("Created.", RolloutCreated)}, (403, 413, 422, 503), body=RolloutCreate, body_required=False),
    Endpoint("post", "/reward", post_reward, "Final reward (closes the rollout) or a reward for one call",
             {200: Answer("Stored (or the same final reward again; `claim`: kept as a claim beside the grader's).",
                          RewardResult)}, (404, 409, 413, 422, 503),
             body=RewardPost),
    Endpoint("post", "/rollouts/{rollout_id}/close", close_rollout,
             "Close a rollout without a final reward: its agent is done (a policy with a teacher trains it)",
             {200: Answer("Closed, or closed already (`closed`: false); `claim`: its grader or judge gives its end, "
                          "so nothing changed.", RolloutClosed)}, (404, 409, 413, 422, 503),
             path_params={"rollout_id": {"type": "string"}}, body=RolloutClose, body_required=False),
    Endpoint("get", "/rollouts/{rollout_id}", get_rollout,
             "A rollout with one page of its calls (token ids, logprobs), their rewards and the rollout's",
             {200: Answer("The rollout; `next` is the `after` of the following page (null on the last).", Rollout)},
             (404, 422, 503), path_params={"rollout_id": {"type": "string"}},
             query_params={"limit": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE},
                           "after": {"type": "integer", "minimum": 0},
                           "calls": {"type": "boolean", "default": True}}),
]
