"""Token buckets, one per caller: the rate limit of keys (limits.py) and of key look-ups (auth.py)."""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass


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
