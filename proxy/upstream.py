"""The engines behind the proxy: one pooled HTTP client, rollout-sticky replica choice, health tracking, and
bounded retries of connection failures — only before any byte has reached the agent.

Rollout-sticky: a rollout's calls go to the replica that ranks first for its id by rendezvous
(highest-random-weight) hashing (`rendezvous`), so its growing prompt keeps hitting one prefix cache. A
replica's weight for a rollout depends on the two alone, so when one of N replicas joins, leaves, is ejected
or is out of rotation for the called policy version (engine/fleet.py), only the rollouts it ranks first for
move: about 1/N of them; every other rollout keeps its replica."""
from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import aiohttp
import orjson
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from engine.adapters import EngineAdapters
from proxy.errors import UpstreamTimeout, engine_failure

log = logging.getLogger("rlproxy.upstream")

# Failures before the response headers, where the engine did not take the request: refused connections, and
# pooled keep-alive connections the engine closed while idle ("Can not write request body" is ClientOSError).
RETRYABLE = (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError, ConnectionRefusedError)


@dataclass(slots=True)
class Replica:
    url: str
    healthy: bool = True
    consecutive_failures: int = 0
    ejected_until: float = 0.0
    base_models: list[str] = field(default_factory=list)
    adapters: dict[str, str | None] = field(default_factory=dict)  # name -> folder, as it reported at the last look

    def available(self, now: float) -> bool:
        return self.healthy or now >= self.ejected_until


def rendezvous(key: str, urls: Iterable[str]) -> list[str]:
    """`urls` in `key`'s order of preference: highest random weight first."""
    return sorted(urls, key=lambda url: hashlib.blake2b(f"{key}|{url}".encode(), digest_size=8).digest(),
                  reverse=True)


class UpstreamPool:
    """All engine replicas. `open()` sends one request to a replica chosen for the rollout, failing over."""

    def __init__(self, urls: list[str] | tuple[str, ...], *, timeout: float, connect_attempts: int = 3,
                 eject_seconds: float = 5.0, api_key: str | None = None) -> None:
        if not urls:
            raise ValueError("at least one upstream URL is needed")
        self.replicas = [Replica(u.rstrip("/")) for u in urls]
        self.timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=10)
        self.connect_attempts = max(1, connect_attempts)
        self.eject_seconds = eject_seconds
        self.session: aiohttp.ClientSession | None = None
        # The proxy's own key for the engines; the agent's Authorization header is never passed on.
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        # adapter name -> replicas out of rotation for it (engine/fleet.py), as the policy router last read them
        self.withheld: Mapping[str, frozenset[str]] = {}

    async def start(self) -> None:
        # Idle connections are dropped before uvicorn's 5 s keep-alive ends, so we rarely meet a closed one.
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=4, enable_cleanup_closed=True)
        self.session = aiohttp.ClientSession(connector=connector, timeout=self.timeout, auto_decompress=False,
                                             headers=self.headers,
                                             cookie_jar=aiohttp.DummyCookieJar(),
                                             json_serialize=lambda o: orjson.dumps(o).decode())

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    def withhold(self, withheld: Mapping[str, frozenset[str]]) -> None:
        """From now on, calls of each adapter name here go only to the replicas not listed for it."""
        self.withheld = withheld

    def choose(self, key: str | None, attempt: int = 0, model: str | None = None) -> Replica:
        """The replica for a call of rollout `key` (None: none, spread) to `model`: by rendezvous hashing over
        the replicas in rotation for `model` that are not ejected. With none in rotation (every replica lost
        the version after it was committed) it falls back to all of them, as it does when all are ejected."""
        now = time.monotonic()
        out = self.withheld.get(model, ()) if model is not None else ()
        serving = [r for r in self.replicas if r.url not in out] or self.replicas
        candidates = [r for r in serving if r.available(now)] or serving
        if key is None:
            ranked = sorted(candidates, key=lambda r: r.consecutive_failures)
            start = int(now * 1000) % len(ranked) if all(r.consecutive_failures == 0 for r in ranked) else 0
            ranked = ranked[start:] + ranked[:start]
        else:
            by_url = {r.url: r for r in candidates}
            ranked = [by_url[url] for url in rendezvous(key, by_url)]
        return ranked[attempt % len(ranked)]

    def mark(self, replica: Replica, ok: bool) -> None:
        if ok:
            replica.healthy, replica.consecutive_failures = True, 0
            return
        replica.consecutive_failures += 1
        replica.healthy = False
        replica.ejected_until = time.monotonic() + self.eject_seconds

    async def open(self, path: str, body: bytes, *, key: str | None = None, headers: dict[str, str] | None = None,
                   model: str | None = None) -> tuple[Replica, aiohttp.ClientResponse]:
        """POST `body` (a call of `model`) to `path` on a replica; returns once the response headers arrived.
        Connection failures are retried on the next replica in the rollout's order, with backoff, a bounded
        number of times (the first attempt goes straight out: retries cost nothing until something fails)."""
        assert self.session is not None, "UpstreamPool.start() was not awaited"
        headers = {"Content-Type": "application/json", **(headers or {})}
        attempt = 0

        async def send() -> tuple[Replica, aiohttp.ClientResponse]:
            nonlocal attempt
            replica = self.choose(key, attempt, model)
            attempt += 1
            try:
                response = await self.session.post(replica.url + path, data=body, headers=headers)
            except RETRYABLE:
                self.mark(replica, ok=False)
                raise
            except aiohttp.ClientError as exc:
                self.mark(replica, ok=False)
                raise engine_failure("engine request failed", exc) from exc
            except asyncio.TimeoutError as exc:
                raise UpstreamTimeout("engine did not answer in time") from exc
            if response.status >= 500:
                self.mark(replica, ok=False)
            elif not replica.healthy:
                self.mark(replica, ok=True)
            return replica, response

        try:
            try:
                return await send()
            except RETRYABLE:
                if self.connect_attempts == 1:
                    raise
            async for retry in AsyncRetrying(
                stop=stop_after_attempt(self.connect_attempts - 1),
                wait=wait_exponential(multiplier=0.05, max=1.0),
                retry=retry_if_exception_type(RETRYABLE),
                reraise=True,
            ):
                with retry:
                    return await send()
        except RETRYABLE as exc:
            raise engine_failure(f"engine unreachable after {attempt} attempt(s)", exc) from exc
        raise AssertionError("unreachable")

    async def tokenize(self, body: bytes, *, key: str | None = None) -> tuple[int, bytes]:
        """(status, body) of the engine's `/tokenize` for `body`, on the replica of the rollout `key`: what the
        token counting routes answer from (a count the engine made of the rendering it would serve)."""
        replica, upstream = await self.open("/tokenize", body, key=key)
        try:
            return upstream.status, await upstream.read()
        except aiohttp.ClientError as exc:
            raise engine_failure("engine connection failed", exc) from None
        finally:
            upstream.close()

    async def model_list(self, key: str | None = None) -> tuple[int, bytes, str]:
        """(status, body, content type) of the engine's `/v1/models`, on the replica of the rollout `key`."""
        assert self.session is not None, "UpstreamPool.start() was not awaited"
        replica = self.choose(key)
        try:
            async with self.session.get(replica.url + "/v1/models") as upstream:
                return upstream.status, await upstream.read(), upstream.content_type
        except (aiohttp.ClientError, OSError) as exc:
            raise engine_failure("engine unreachable", exc) from exc

    async def get_json(self, replica: Replica, path: str, *, timeout: float = 5.0) -> dict:
        assert self.session is not None
        async with self.session.get(replica.url + path, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            resp.raise_for_status()
            return orjson.loads(await resp.read())

    def adapters(self, urls: list[str] | None = None, *, attempts: int = 2) -> EngineAdapters:
        """The adapter routes of these replicas (or of `urls`), through this pool's connections and engine key."""
        assert self.session is not None, "UpstreamPool.start() was not awaited"
        return EngineAdapters(urls or [r.url for r in self.replicas], http=self.session, attempts=attempts)

    async def refresh_health(self) -> None:
        """Ask each replica for its models; a replica that answers is healthy again."""
        async def probe(replica: Replica) -> None:
            try:
                data = await self.get_json(replica, "/v1/models", timeout=3.0)
                # vLLM lists adapters with `parent` set to their base model; the base has none.
                replica.base_models = [m["id"] for m in data.get("data", []) if not m.get("parent")]
                replica.adapters = {m["id"]: m.get("root") for m in data.get("data", []) if m.get("parent")}
                self.mark(replica, ok=True)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
                log.debug("replica %s unhealthy: %s", replica.url, exc)
                self.mark(replica, ok=False)

        await asyncio.gather(*(probe(r) for r in self.replicas))

    def base_model(self) -> str | None:
        """The base model the replicas serve (adapters are not base models)."""
        for replica in self.replicas:
            if replica.base_models:
                return replica.base_models[0]
        return None
