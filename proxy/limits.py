"""Limits at the edge: requests per second per key (a token bucket in memory), the request body size (and what a
compressed body may inflate to: proxy/uploads.py), how deeply a JSON body may nest, and the `max_tokens` / `n` an
OpenAI request may ask for. Each answers with an error in the route's shape before the request reaches the engine
or the recorder."""
from __future__ import annotations

import math
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from core.settings import ProxySettings
from proxy.auth import KEY, Access, access_for, is_openai_route
from proxy.errors import InvalidRequest, PayloadTooLarge, RateLimited
from proxy.uploads import InflateBounds, body_encoding, continue_upload, inflate_body

TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")  # chat, Messages; Responses

MAX_JSON_DEPTH = 64
"""The deepest nesting of arrays and objects accepted in a JSON body (the body itself is level 1). orjson reads
up to 1,024 levels but writes only up to 254, and every call is written again: to the engine, to the spool, to
the database. A body that could be read but not written would fail after it was answered, where no error can
reach its sender. Agents' bodies, JSON schemas of tools included, stay far below 64."""


def too_deep(value: Any, raw: bytes | None = None, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether parsed JSON `value` nests deeper than `limit`. With the `raw` bytes it came from, most bodies are
    cleared at once: nesting cannot exceed the number of opening brackets."""
    if raw is not None and raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    level, depth = [value], 0  # breadth first, one level at a time: no recursion to run out of
    while level:
        depth += 1
        if depth > limit:
            return True
        below = []
        for item in level:
            for child in item.values() if type(item) is dict else item if type(item) is list else ():
                if type(child) is dict or type(child) is list:
                    below.append(child)
        level = below
    return False


def refuse_deep_json(raw: bytes) -> None:
    """A relayed engine body that is JSON nested too deeply: 400 `json_too_deep`, as on the proxy's own routes. The
    proxy parses these bodies too (the `model` a key may call), and the engine is spared a body no agent sends.
    A body that is not JSON is the engine's to refuse."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:  # nearly every body: no parsing here
        return
    try:
        deep = too_deep(orjson.loads(raw))
    except orjson.JSONDecodeError as exc:
        deep = "depth limit" in str(exc)  # past orjson's own 1,024 levels: still JSON, just deeper still
    if deep:
        raise InvalidRequest(f"request body nests arrays and objects more than {MAX_JSON_DEPTH} levels deep",
                             code="json_too_deep")


@dataclass(slots=True)
class TokenBucket:
    rate: float  # tokens added per second
    burst: float  # capacity
    tokens: float
    stamp: float

    def take(self, now: float) -> float:
        """Take one token; 0 if there was one, else the seconds until there will be."""
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


class RateLimiter:
    """One bucket per caller (key id, or client address when auth is off). Buckets of callers not seen for a
    while are dropped first when there are too many; a dropped bucket comes back full, which only errs
    towards letting a request through."""

    def __init__(self, maxsize: int = 100_000) -> None:
        self.maxsize = maxsize
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def take(self, caller: str, rate: float, burst: int) -> float:
        now = time.monotonic()
        bucket = self._buckets.get(caller)
        if bucket is None or bucket.rate != rate or bucket.burst != burst:
            bucket = self._buckets[caller] = TokenBucket(rate, burst, burst, now)
        self._buckets.move_to_end(caller)
        if len(self._buckets) > self.maxsize:
            self._buckets.popitem(last=False)
        return bucket.take(now)


class Limits:
    def __init__(self, settings: ProxySettings) -> None:
        auth = settings.auth
        self.rate = auth.rate_limit
        self.burst = auth.rate_burst
        self.max_body = settings.client_max_size
        self.inflate = InflateBounds(min(settings.max_inflated_size, settings.client_max_size),
                                     settings.max_inflation_ratio)
        self.max_tokens = auth.max_tokens
        self.max_n = auth.max_n
        self.limiter = RateLimiter()

    def check_rate(self, request: web.Request) -> None:
        key = request.get(KEY)
        rate = key.rate_limit if key is not None and key.rate_limit is not None else self.rate
        if not rate:
            return
        burst = key.rate_burst if key is not None and key.rate_burst is not None else self.burst
        burst = burst or max(1, math.ceil(rate))
        caller = f"key:{key.id}" if key is not None else f"addr:{request.remote}"
        wait = self.limiter.take(caller, rate, burst)
        if wait:
            raise RateLimited(f"rate limit reached: {rate:g} requests/s with bursts of {burst}; "
                              f"retry in {wait:.2f}s", retry_after=max(1, math.ceil(wait)))

    def check_size(self, request: web.Request) -> None:
        """A declared length above the limit is refused before reading; a chunked body that grows past it is
        stopped by aiohttp itself (`client_max_size`), which the error middleware shapes the same way."""
        if request.content_length is not None and request.content_length > self.max_body:
            raise PayloadTooLarge(f"request body of {request.content_length} bytes is larger than the "
                                  f"{self.max_body} bytes this proxy accepts")

    async def check_body(self, request: web.Request) -> None:
        """`max_tokens` and `n` of an OpenAI request. Anything unreadable is left to the route, which
        answers malformed bodies itself."""
        if request.method != "POST" or not (self.max_tokens or self.max_n) or not is_openai_route(request):
            return
        try:
            body = orjson.loads(await request.read())  # aiohttp keeps the bytes for the route's own read()
        except orjson.JSONDecodeError:
            return
        if not isinstance(body, dict):
            return
        if self.max_tokens:
            for name in TOKEN_FIELDS:
                _check_count(body, name, self.max_tokens)
        if self.max_n:
            _check_count(body, "n", self.max_n)


def _check_count(body: dict, name: str, limit: int) -> None:
    value = body.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{name} must be an integer", param=name, code="invalid_type")
    if value > limit:
        raise InvalidRequest(f"{name} is {value}, above this proxy's limit of {limit}", param=name,
                             code=f"{name}_too_large")


LIMITS = web.AppKey("rlproxy_limits", Limits)


@web.middleware
async def enforce_limits(request: web.Request, handler):
    """Rate and declared size, then (only then) the body: `100 Continue` if asked for, a compressed body
    inflated within its bounds, the OpenAI fields checked."""
    limits = request.app[LIMITS]
    checked = access_for(request) is not Access.PUBLIC
    if checked:
        limits.check_rate(request)
        limits.check_size(request)
    if request.body_exists:
        body_encoding(request)  # an encoding the proxy does not read: 415 before the body is invited
    await continue_upload(request)
    await inflate_body(request, limits.inflate, limits.max_body)
    if checked:
        await limits.check_body(request)
    return await handler(request)
