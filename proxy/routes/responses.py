"""OpenAI Responses API: `POST /v1/responses` and `GET /v1/responses/{response_id}`, under the same prefixes
as chat (so a rollout is tracked by `base_url` alone).

The proxy keeps response state itself, in the calls it records: a response's id is `resp_<call id>`, `GET`
returns the Response the agent received, and `previous_response_id` continues a conversation from the earlier
turns' recorded input and output. `store: false` responses are recorded for training like any other call but
cannot be fetched or continued, as with OpenAI."""
from __future__ import annotations

from typing import Any

from aiohttp import web

from proxy.edge import token_rollout
from proxy.bodies import Response
from core.responses_chat import history_messages
from proxy.context import CallContext, call_context
from proxy.dialects.responses import RESPONSES, ResponsesRequest
from proxy.api import API_ERRORS, Answer, Endpoint, PREFIXES, RECORDED, mounted
from proxy.errors import InvalidRequest, NotFoundError, json_response
from proxy.state import ProxyState, state
from store.calls import StoredCall, get_call

MAX_CHAIN = 1000  # turns followed back through previous_response_id before giving up (a loop guard)


async def create_response(request: web.Request) -> web.StreamResponse:
    app = state(request)

    async def history(body: dict[str, Any], context: CallContext) -> list[dict[str, Any]]:
        previous = body.get("previous_response_id")
        return await conversation_before(app, previous, context.project, token_rollout(request)) if previous else []

    return await app.serving[RESPONSES.route].handle(request, history)


async def get_response(request: web.Request) -> web.Response:
    context = call_context(request)
    app = state(request)
    stored = await _stored_response(app, request.match_info["response_id"], context.project, token_rollout(request),
                                    param=None)
    return json_response(stored.response)


async def conversation_before(app: ProxyState, response_id: str, project: str | None,
                              rollout_id: str | None = None) -> list[dict[str, Any]]:
    """Every earlier turn of the conversation that ends with `response_id`, oldest first, as chat messages (with
    `rollout_id`, a rollout token's: that rollout's turns alone)."""
    turns: list[list[dict[str, Any]]] = []
    seen: set[str] = set()
    while response_id:
        if response_id in seen or len(turns) >= MAX_CHAIN:
            raise InvalidRequest(f"previous_response_id chain through {response_id!r} is too long or loops",
                                 param="previous_response_id")
        seen.add(response_id)
        stored = await _stored_response(app, response_id, project, rollout_id, param="previous_response_id")
        turns.append(history_messages(stored.request, stored.response))
        response_id = stored.request.get("previous_response_id")
    return [message for turn in reversed(turns) for message in turn]


async def _stored_response(app: ProxyState, response_id: str, project: str | None, rollout_id: str | None, *,
                           param: str | None) -> StoredCall:
    missing = NotFoundError(f"Response with id '{response_id}' not found.", param=param)
    if not response_id.startswith("resp_") or "\x00" in response_id:
        raise missing
    await app.writer.sync()  # the turn just answered may still be on its way to the database
    async with app.sessions() as session:
        stored = await get_call(session, response_id.removeprefix("resp_"), project=project, rollout_id=rollout_id)
    if (stored is None or stored.route != RESPONSES.route or not stored.request or not stored.response
            or stored.request.get("store") is False or "output" not in stored.response):
        raise missing
    return stored


ENDPOINTS = mounted([
    Endpoint("post", "/v1/responses", create_response, "OpenAI Responses API",
             {200: Answer("The answer (events when `stream` is true).", Response, stream=True, call_id=True)},
             API_ERRORS, body=ResponsesRequest, engine_errors=True, context_headers=True,
             example=lambda model: {"model": model, "input": "What is 6*7?"}),
    Endpoint("get", "/v1/responses/{response_id}", get_response, "A stored Response (kept by the proxy)",
             {200: Answer("The Response.", Response)}, (400, 404, 503), context_headers=True),
], PREFIXES, RECORDED)
