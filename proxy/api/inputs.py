"""What a route reads from a request besides its JSON body, written once for every route: a body read only up to the
route's own bound, a rollout id from the path, and query parameters (text, numbers, flags) checked against their
bounds. Each refusal is the route's own error class (`error`): the JSON routes answer 422 for what they cannot
take, the web view's 400, as each documents."""
from __future__ import annotations

import math
from collections.abc import Callable

from aiohttp import web

from proxy.edge import read_within
from proxy.errors import InvalidRequest, NotFoundError, ProxyError

Refusal = type[ProxyError]


async def read_bounded(request: web.Request, limit: int, too_large: Callable[[int | None], ProxyError]) -> bytes:
    """The body, at most `limit` bytes: a declared length past it is refused before anything is read, a chunked
    body as soon as it passes it (`too_large(size)`: the declared size, None for a chunked body)."""
    size = request.content_length
    raw = await read_within(request, limit) if size is None or size <= limit else None
    if raw is None:
        raise too_large(size)
    return raw


def rollout_in_path(request: web.Request) -> str:
    """The path's `{rollout_id}`; 404 for one holding NUL: the store cannot hold NUL, so no such rollout exists."""
    rollout_id = request.match_info["rollout_id"]
    if "\x00" in rollout_id:
        raise NotFoundError(f"rollout {rollout_id!r} does not exist")
    return rollout_id


def query_text(request: web.Request, name: str, limit: int = 256, error: Refusal = InvalidRequest) -> str | None:
    """The query parameter `name`; None when absent or empty; refused when longer than `limit` or holding NUL."""
    value = request.query.get(name)
    if value is None or value == "":
        return None
    if len(value) > limit or "\x00" in value:
        raise error(f"{name} is longer than {limit} characters or holds NUL", param=name)
    return value


def query_number(request: web.Request, name: str, kind: type[int] | type[float] = float, least: float | None = None,
                 most: float | None = None, error: Refusal = InvalidRequest):
    """The query parameter `name` as a finite `kind` (int or float) within [least, most]; None when absent."""
    text = query_text(request, name, 64, error)
    if text is None:
        return None
    what = "an integer" if kind is int else "a number"
    bounds = (f" from {least} to {most}" if least is not None and most is not None else
              f" of at least {least}" if least is not None else f" of at most {most}" if most is not None else "")
    try:
        value = kind(text)
    except ValueError:
        raise error(f"{name} must be {what}{bounds}, not {text!r}", param=name) from None
    if not math.isfinite(value) or (least is not None and value < least) or (most is not None and value > most):
        raise error(f"{name} must be {what}{bounds}, not {text!r}", param=name)
    return value


def query_flag(request: web.Request, name: str, error: Refusal = InvalidRequest) -> bool | None:
    """The query parameter `name` as true or false (in any case); None when absent."""
    text = query_text(request, name, 8, error)
    if text is None:
        return None
    if text.lower() not in ("true", "false"):
        raise error(f"{name} must be true or false, not {text!r}", param=name)
    return text.lower() == "true"
