"""Limits at the edge: requests per second per key (a token bucket in memory), the request body size (and what a
compressed body may inflate to: proxy/edge/uploads.py) and the requests a key has open; how large and deep a JSON body
may be is the JSON parser's (proxy/strict_json.py). Each answers with an error
in the route's shape before the request reaches the engine or the recorder. The token budget (`--max-tokens`,
`--max-n`) is checked on the parsed body, at the request boundary (proxy/boundary.py)."""
from __future__ import annotations

import contextlib
import math

from aiohttp import web

from core.settings import ProxySettings
from proxy.edge.access import KEY, Access, access_for, reads_no_rollout
from proxy.edge.buckets import RateLimiter
from proxy.errors import InvalidRequest, PayloadTooLarge, RateLimited
from proxy.metrics import ProxyMetrics
from proxy.edge.storage_budget import StorageBudget, stored_bytes
from proxy.edge.uploads import InflateBounds, body_encoding, check_transfer_coding, continue_upload, inflate_body

class Limits:
    def __init__(self, settings: ProxySettings, metrics: ProxyMetrics | None = None) -> None:
        self.metrics = metrics
        auth = settings.auth
        self.rate = auth.rate_limit
        self.burst = auth.rate_burst
        self.max_body = settings.client_max_size
        self.inflate = InflateBounds(min(settings.max_inflated_size, settings.client_max_size),
                                     settings.max_inflation_ratio)
        self.limiter = RateLimiter()
        self.max_open = auth.max_open_per_key
        self.open: dict[str, int] = {}  # key id -> its requests being served (no entry at 0)
        self.storage = StorageBudget(settings.project_bytes_per_hour)

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

    @contextlib.contextmanager
    def open_request(self, request: web.Request):
        """Count the request among its key's open ones while it is served (a stream until its last byte); 429
        when the key has `max_open_per_key` open already."""
        key = request.get(KEY)
        if key is None or not self.max_open:
            yield
            return
        held = self.open.get(key.id, 0)
        if held >= self.max_open:
            raise RateLimited(f"this key has {held} requests open, the most one key may (--max-open-per-key "
                              f"{self.max_open}); retry once one of them ends", retry_after=1,
                              code="too_many_open_requests")
        self.open[key.id] = held + 1
        try:
            yield
        finally:
            left = self.open[key.id] - 1
            if left:
                self.open[key.id] = left
            else:
                del self.open[key.id]

    def stores_for(self, request: web.Request) -> str | None:
        """The project a request would make the proxy store data for (`--project-bytes-per-hour`): a project
        key's requests with a body, but those of the routes that record nothing."""
        key = request.get(KEY)
        if not self.storage.enabled or key is None or key.project is None or request.method in ("GET", "HEAD"):
            return None
        return None if reads_no_rollout(request) else key.project

    def check_size(self, request: web.Request) -> None:
        """A declared length above the limit is refused before reading; a chunked body that grows past it is
        stopped by aiohttp itself (`client_max_size`), which the error middleware shapes the same way."""
        if request.content_length is not None and request.content_length > self.max_body:
            raise PayloadTooLarge(f"request body of {request.content_length} bytes is larger than the "
                                  f"{self.max_body} bytes this proxy accepts")


LIMITS = web.AppKey("rlproxy_limits", Limits)


@web.middleware
async def enforce_limits(request: web.Request, handler):
    """Rate and declared size, then (only then) the body: `100 Continue` if asked for, a compressed body
    inflated within its bounds."""
    limits = request.app[LIMITS]
    check_transfer_coding(request)
    checked = access_for(request) is not Access.PUBLIC
    if checked:
        limits.check_rate(request)
        limits.check_size(request)
    elif request.body_exists:  # no public route reads a body: none is invited, inflated or read for one
        raise InvalidRequest("this route takes no request body", code="body_not_allowed")
    if request.body_exists:
        body_encoding(request)  # an encoding the proxy does not read: 415 before the body is invited
    with limits.open_request(request) if checked else contextlib.nullcontext():
        project = limits.stores_for(request) if checked else None
        if project is not None:
            try:
                limits.storage.admit(project)
            except RateLimited:
                if limits.metrics is not None:
                    limits.metrics.storage_refused.inc()
                raise
        await continue_upload(request)
        await inflate_body(request, limits.inflate, limits.max_body)
        response = None
        try:
            response = await handler(request)
            return response
        finally:
            if project is not None:  # charged also when it failed: its call is recorded all the same
                limits.storage.take(project, stored_bytes(request, response))
