"""The read-only web view: `GET /ui/` (one page and its script and style, no data in them) and the JSON it reads
under `/ui/api/`, scoped like the rest of the API (a project key sees its own project, the operator key all).

The page is public so a browser can load it and ask for a key; everything it shows comes from the JSON routes, which
need a key when auth is on. Nothing here writes. Answers are serialised in a worker thread: a page of calls may hold
large request and response bodies, and the event loop serves every tenant.
"""
from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from importlib import resources
from typing import Any

import orjson
from aiohttp import web
from pydantic import BaseModel, ConfigDict

from core.policy_rules import RuleError, check_policy_name
from proxy.api import Answer, Endpoint, query_flag, query_number, query_text, rollout_in_path
from proxy.errors import Forbidden, InvalidRequest, NotFoundError, StoreUnavailable
from proxy.state import state
from proxy.token_text import token_texts
from store import browse, step_history

# The script is ES modules: app.js imports the others (plain files, no build step).
ASSETS = {"app.js": "text/javascript", "common.js": "text/javascript", "turns.js": "text/javascript",
          "policies.js": "text/javascript", "training.js": "text/javascript", "charts.js": "text/javascript",
          "style.css": "text/css"}
# The page loads only its own script and style and talks only to this server: injected markup could not run or
# send anything anywhere, and no other site may frame it.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _asset(name: str) -> bytes:
    return resources.files("proxy.ui").joinpath(name).read_bytes()


async def page(request: web.Request) -> web.Response:
    return web.Response(body=_asset("index.html"), content_type="text/html", charset="utf-8",
                        headers=SECURITY_HEADERS)


async def asset(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in ASSETS:
        raise NotFoundError(f"no asset {name!r}")
    return web.Response(body=_asset(name), content_type=ASSETS[name], charset="utf-8", headers=SECURITY_HEADERS)


async def _json(payload: Any) -> web.Response:
    body = await asyncio.to_thread(orjson.dumps, payload)
    return web.Response(body=body, content_type="application/json", headers=SECURITY_HEADERS)


# --- query parameters -----------------------------------------------------------------------------------------
def _moment(request: web.Request, name: str) -> datetime | None:
    value = query_text(request, name, 64)
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
        # in UTC here: a time at the ends of the calendar (year 1 at +14:00) has no UTC time, which the database
        # would find out as an error
        return moment.astimezone(timezone.utc) if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
    except (ValueError, OverflowError):
        raise InvalidRequest(f"{name} must be an ISO 8601 time like 2026-11-26T17:00:00Z", param=name) from None


def _filter(request: web.Request) -> browse.RolloutFilter:
    status = query_text(request, "status", 16)
    if status is not None and status not in ("open", "finished", "expired"):
        raise InvalidRequest("status must be open, finished or expired", param="status")
    return browse.RolloutFilter(
        project=query_text(request, "project", 128), agent=query_text(request, "agent", 128),
        task_id=query_text(request, "task_id"), status=status,
        reward_min=query_number(request, "reward_min"), reward_max=query_number(request, "reward_max"),
        policy_version=query_number(request, "policy", int, 0, 2**31 - 1),
        since=_moment(request, "since"), until=_moment(request, "until"), eval=query_flag(request, "eval"))


# --- the JSON routes ----------------------------------------------------------------------------------------------
@asynccontextmanager
async def _reading(request: web.Request):
    """A session for one answer; a query past the web view's time limit (store/browse.py) is the store's 503."""
    try:
        async with state(request).sessions() as session:
            yield session
    except browse.TooSlow as exc:
        raise StoreUnavailable(str(exc)) from None


async def list_rollouts(request: web.Request) -> web.Response:
    # Everything the request says is checked before the writer is asked to catch up: a refused query costs nothing
    # and puts nothing on the writer's queue.
    limit = query_number(request, "limit", int, 1, browse.MAX_PAGE) or 50
    filters = _filter(request)
    try:
        query = browse.check_list_query(query_text(request, "sort", 16) or "newest", limit, query_text(request, "cursor", 1024))
    except browse.BadQuery as exc:
        raise InvalidRequest(str(exc)) from None
    await state(request).writer.sync()  # calls acknowledged a moment ago are listed too
    async with _reading(request) as session:
        page_ = await browse.list_rollouts(session, request.get("project"), filters, query)
    return await _json(page_)


async def rollout_calls(request: web.Request) -> web.Response:
    after = query_number(request, "after", int, -1, 2**31 - 1)
    limit = query_number(request, "limit", int, 1, browse.MAX_PAGE) or 20
    rollout_id = rollout_in_path(request)
    await state(request).writer.sync()
    async with _reading(request) as session:
        found = await browse.rollout_page(session, request.get("project"), rollout_id,
                                          after=-1 if after is None else after, limit=limit)
    if found is None:
        raise NotFoundError(f"rollout {rollout_id!r} does not exist")
    texts = await token_texts(state(request), [c["completion_token_ids"] for c in found["calls"]])
    for call, text in zip(found["calls"], texts):
        call["completion_token_text"] = text  # each token's text, by the engine's tokenizer (proxy/token_text.py)
    return await _json(found)


async def task_attempts(request: web.Request) -> web.Response:
    """The attempts of one task, newest first, with the group-relative advantage GRPO gives each finished one that
    is not evaluation traffic (store/browse.py task_group)."""
    # `?task_id=` names a task the path cannot: browsers resolve a path segment `.` or `..` (also written %2E)
    # away before the request leaves, so the view asks for those as `tasks/-?task_id=..`.
    task_id = query_text(request, "task_id") or request.match_info["task_id"]
    if "\x00" in task_id:
        raise NotFoundError(f"task {task_id!r} has no rollouts")
    async with _reading(request) as session:
        group = await browse.task_group(session, request.get("project"), task_id)
    if not group["data"]:
        raise NotFoundError(f"task {task_id!r} has no rollouts")
    return await _json({"task_id": task_id, "estimator": "grpo", **group})


async def training(request: web.Request) -> web.Response:
    """A named policy's training steps over time, oldest first (store/step_history.py): the operator's only, as
    the step records are on `GET /policies` (a step's batch holds every project's rollouts)."""
    try:
        policy = check_policy_name(query_text(request, "policy", 64) or state(request).router.rules.default)
    except RuleError as exc:
        raise InvalidRequest(str(exc), param="policy") from None
    limit = query_number(request, "limit", int, 1, step_history.MAX_STEPS) or 500
    if request.get("project") is not None:
        raise Forbidden("the training steps hold every project's rollouts: only the operator key reads them")
    async with _reading(request) as session:
        steps = await step_history.policy_steps(session, policy, limit=limit)
    return await _json({"policy": policy, "charted": list(step_history.CHARTED), "data": steps})


# --- documentation -----------------------------------------------------------------------------------------------
class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class UiRolloutPage(_Open):
    data: list[dict[str, Any]]
    next: str | None
    total: int | None  # on the first page only (no cursor): how many match, up to browse.TOTAL_CAP
    total_exact: bool | None  # false: more than `total` match


class UiRolloutCalls(_Open):
    rollout: dict[str, Any]
    rewards: list[dict[str, Any]]
    calls: list[dict[str, Any]]
    next: int | None


class UiTraining(_Open):
    policy: str
    charted: list[str]  # the step record fields each step carries (core/step_record.py)
    data: list[dict[str, Any]]  # one per step, oldest first: step_id, at, version (None: nothing of it trained)


class UiTaskAttempts(_Open):
    task_id: str
    data: list[dict[str, Any]]
    estimator: str
    truncated: bool  # more attempts than browse.MAX_GROUP: the oldest are not listed


_STRING = {"type": "string"}
LIST_QUERY = {
    "project": _STRING | {"description": "Only this project (the operator key; a project key sees its own only)."},
    "agent": _STRING, "task_id": _STRING,
    "status": {"type": "string", "enum": ["open", "finished", "expired"]},
    "reward_min": {"type": "number"}, "reward_max": {"type": "number"},
    "policy": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1, "description": "The serving policy version."},
    "since": {"type": "string", "format": "date-time"}, "until": {"type": "string", "format": "date-time"},
    "eval": {"type": "string", "enum": ["true", "false"]},
    "sort": {"type": "string", "enum": list(browse.SORTS)},
    "limit": {"type": "integer", "minimum": 1, "maximum": browse.MAX_PAGE},
    "cursor": _STRING | {"description": "The `next` of the previous page."},
}
TASK_QUERY = {"task_id": _STRING | {"description": "The task, in place of the path's: for `.` and `..`, which a "
                                                  "browser resolves away in a path."}}
CALLS_QUERY = {"after": {"type": "integer", "minimum": -1, "maximum": 2**31 - 1,
                         "description": "Calls after this seq (the previous page's `next`)."},
               "limit": {"type": "integer", "minimum": 1, "maximum": browse.MAX_PAGE}}

TRAINING_QUERY = {"policy": {"type": "string", "pattern": r"^[A-Za-z0-9._-]{1,64}$",
                              "description": "A named policy (default: the proxy's default policy)."},
                  "limit": {"type": "integer", "minimum": 1, "maximum": step_history.MAX_STEPS,
                            "description": "The newest steps (500 unless given)."}}

ENDPOINTS = [
    Endpoint("get", "/ui/", page, "The web view (read-only; it asks for a key and reads the routes below)",
             {200: Answer("The page.", media=("text/html",))}, access="public"),
    Endpoint("get", "/ui/assets/{name}", asset, "The web view's script and style",
             {200: Answer("The file.", media=tuple(dict.fromkeys(ASSETS.values())))}, (404,), access="public",
             path_params={"name": {"type": "string", "enum": list(ASSETS)}}),
    Endpoint("get", "/ui/api/rollouts", list_rollouts, "Rollouts, filtered and sorted, a keyset page at a time",
             {200: Answer("A page.", UiRolloutPage)}, (400, 503), query_params=LIST_QUERY),
    Endpoint("get", "/ui/api/rollouts/{rollout_id}", rollout_calls, "One rollout with its rewards and a page of "
             "its calls", {200: Answer("The rollout.", UiRolloutCalls)}, (400, 404, 503),
             path_params={"rollout_id": _STRING}, query_params=CALLS_QUERY),
    Endpoint("get", "/ui/api/tasks/{task_id}", task_attempts, "The attempts of one task and their advantages",
             {200: Answer("The group.", UiTaskAttempts)}, (400, 404, 503), path_params={"task_id": _STRING},
             query_params=TASK_QUERY),
    Endpoint("get", "/ui/api/training", training, "A named policy's training steps over time (operator key)",
             {200: Answer("The steps.", UiTraining)}, (400, 403, 503), query_params=TRAINING_QUERY),
]
