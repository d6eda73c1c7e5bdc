"""A project's storage budget (`--project-bytes-per-hour`): what one project's keys make this proxy store (calls'
requests and answers, rollouts' metadata, events, rewards) is bounded per hour, so one key within every
per-request bound cannot fill the database for everyone (one did at about 14 GiB an hour).

A bucket of bytes per project, refilled at the budget's rate and holding at most one hour's worth. A request is
admitted while its project's bucket holds any bytes; its own bytes (its body as it arrives, its answer as it went
out) are taken once known, even past what is left: what is accepted is never cut short or lost, and the debt it
leaves turns the project's next requests away (429, Retry-After: when the debt is refilled) until it is paid. Per
proxy process: with several proxies a project may store up to that many budgets."""
from __future__ import annotations

import math
import time
from collections import OrderedDict

from aiohttp import web

from proxy.errors import RateLimited

HOUR = 3600.0


class StorageBudget:
    def __init__(self, bytes_per_hour: int, maxsize: int = 100_000) -> None:
        self.rate = bytes_per_hour / HOUR  # bytes per second
        self.capacity = float(bytes_per_hour)
        self.maxsize = maxsize
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # project -> (bytes, stamp)

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    def _level(self, project: str, now: float) -> float:
        held, stamp = self._buckets.get(project, (self.capacity, now))
        return min(self.capacity, held + (now - stamp) * self.rate)

    def admit(self, project: str) -> None:
        """RateLimited when the project's bucket is empty or in debt."""
        now = time.monotonic()
        level = self._level(project, now)
        if level <= 0:
            wait = max(1, math.ceil((1 - level) / self.rate))
            raise RateLimited(f"project {project!r} stored its {self.capacity / 2**20:.0f} MiB of this hour "
                              f"(--project-bytes-per-hour); retry in {wait} s", retry_after=wait,
                              code="storage_budget_exceeded")

    def take(self, project: str, size: int) -> None:
        """Charge `size` bytes the project's request made the proxy store (never refused: see the module)."""
        if size <= 0:
            return
        now = time.monotonic()
        self._buckets[project] = (self._level(project, now) - size, now)
        self._buckets.move_to_end(project)
        if len(self._buckets) > self.maxsize:
            self._buckets.popitem(last=False)  # an old bucket comes back full: errs towards admitting


def stored_bytes(request: web.Request, response: web.StreamResponse | None) -> int:
    """What a request made the proxy store, as far as the edge can tell: its body and its answer."""
    body = request.content_length or 0
    if response is None:
        return body
    if isinstance(response, web.Response) and isinstance(response.body, (bytes, bytearray)):
        return body + len(response.body)  # sent after the middleware returns: its length is known already
    return body + response.body_length  # a stream, written by its handler
