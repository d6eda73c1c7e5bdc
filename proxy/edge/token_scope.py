"""What a rollout's own token may do, and whom a request speaks for.

A rollout's token (`rlr_…`, what `POST /rollouts` answers as `token`) and its grader token (`rlg_…`) are checked
like keys (proxy/edge/auth.py: the same caches, the same look-up limit) and held to their rollout whether auth is on
or off (`check_token_scope`): the routes under `/rollouts/{its id}/…`, the OpenAI routes with `X-Rollout-Id: its
id`, and `POST /reward` for it; another rollout answers 404 as an unused id does, every other route 403. With auth
off a request with no credential is open as before (every local process is trusted), but one that presents a token
is held to it. Who a reward comes from (`reward_giver`) decides whether a sealed rollout takes it or keeps it as a
claim (store/rollouts.py); who may create evaluation rollouts is `may_create_eval`'s.

The authenticator calls `presents_rollout_token` and `check_token_scope`; the routes call the rest with the key it
left on the request."""
from __future__ import annotations

from aiohttp import web

from proxy.context import one_header
from proxy.edge.access import AUTH, KEY, KEY_HEADERS, is_openai_route, is_operator_key, route_pattern
from proxy.errors import Forbidden, NotFoundError
from store.keys import KeyInfo
from store.reward_sources import RewardedBy
from store.rollout_tokens import is_rollout_token


def presents_rollout_token(request: web.Request) -> bool:
    """Whether the request presents something shaped as a rollout's token (with auth off, only those are read)."""
    values = [value.partition(" ")[2].strip() for value in request.headers.getall("Authorization", ())]
    values += [value.strip() for header in KEY_HEADERS for value in request.headers.getall(header, ())]
    return any(is_rollout_token(value) for value in values)


TOKEN_MESSAGE = ("a rollout token is good for its own rollout alone: the routes under /rollouts/{rollout_id}/, the "
                 "OpenAI routes with X-Rollout-Id, and POST /reward for it")


def check_token_scope(request: web.Request, key: KeyInfo) -> None:
    """A rollout token's request goes on only within its rollout: under another rollout's id it is 404 (as an
    unused id would answer, which the token may not create either), on any other route 403."""
    pattern = route_pattern(request)
    if pattern is None:  # no such route: 404 as for anyone
        return
    if pattern.startswith("/rollouts/{rollout_id}"):
        named = request.match_info.get("rollout_id")
    elif is_openai_route(request):
        named = one_header(request, "X-Rollout-Id")
        if not named:
            raise Forbidden(f"{TOKEN_MESSAGE}: send X-Rollout-Id: {key.rollout}", code="rollout_token_scope")
    elif request.method == "POST" and pattern == "/reward":
        return  # its body names the rollout: checked by the route (`own_rollout`)
    else:
        raise Forbidden(f"{TOKEN_MESSAGE}; {request.method} {pattern} is not one of them", code="rollout_token_scope")
    own_rollout(request, named)


def own_rollout(request: web.Request, rollout_id: str | None) -> None:
    """404 when the request's rollout token is another rollout's than `rollout_id` (no token: nothing to check)."""
    key = request.get(KEY)
    if key is not None and key.rollout is not None and rollout_id != key.rollout:
        raise NotFoundError(f"rollout {rollout_id!r} does not exist")


def token_rollout(request: web.Request) -> str | None:
    """The rollout a request's rollout token is good for (None: no token): what it reads is that rollout's only."""
    key = request.get(KEY)
    return key.rollout if key is not None else None


def reward_giver(request: web.Request, rollout_id: str) -> str:
    """Who a reward posted by this request comes from (a RewardedBy). With auth off a request without a credential
    is its agent's, not the operator's: only a grader token gives the reward of a rollout whose grader gives it."""
    key = request.get(KEY)
    if key is None:
        return RewardedBy.AGENT
    if key.rollout is not None:
        return RewardedBy.GRADER if key.grader and key.rollout == rollout_id else RewardedBy.AGENT
    if is_operator_key(key):
        return RewardedBy.OPERATOR
    if key.admin:
        return RewardedBy.ADMIN
    return RewardedBy.EVAL_KEY if key.eval else RewardedBy.AGENT


def may_create_eval(request: web.Request) -> bool:
    """Whether the request may create evaluation rollouts: the operator key, an admin key of a project, or a key
    made for evaluation (auth on); with auth off every caller but a rollout token."""
    key = request.get(KEY)
    if key is None:
        return not request.app[AUTH].enabled
    return key.rollout is None and (key.admin or key.eval)
