"""Publishing a trained adapter with no downtime: load it into every engine replica under a new name, and
only then make it the active policy (the proxies follow within a second). A failed load leaves the old
version serving and marks the new one failed. Old versions are unloaded once nothing can still use them."""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import aiohttp
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from store import policies
from store.models import PolicyStatus

log = logging.getLogger("rlproxy.publish")


class LoadFailed(Exception):
    """An engine refused or could not be reached to load an adapter."""


@dataclass(slots=True, frozen=True)
class Published:
    version: int
    activated: bool
    load_seconds: float
    error: str | None = None


class Publisher:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], engines: list[str] | tuple[str, ...], *,
                 attempts: int = 5, drain_seconds: float = 30.0, api_key: str | None = None) -> None:
        self.sessions = sessions
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}  # engines run with --api-key
        self.engines = [e.rstrip("/") for e in engines]
        self.attempts = attempts
        self.drain_seconds = drain_seconds
        self._retired: list[tuple[float, str]] = []  # (when it stopped serving, adapter name)

    async def load(self, name: str, path: str) -> float:
        """Load `name` from `path` on every engine; raises LoadFailed. Returns seconds taken."""
        began = time.perf_counter()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120), headers=self.headers) as http:
            # Every engine's answer is awaited, so none is still loading when this gives up.
            results = await asyncio.gather(*(self._load_one(http, engine, name, path) for engine in self.engines),
                                           return_exceptions=True)
            failures = [r for r in results if isinstance(r, BaseException)]
            if failures:
                # The engines that took it would keep an adapter that never serves: unload it there.
                await self._unload(http, name, [e for e, r in zip(self.engines, results) if r is None])
                raise failures[0]
        return time.perf_counter() - began

    async def _load_one(self, http: aiohttp.ClientSession, engine: str, name: str, path: str) -> None:
        async for attempt in AsyncRetrying(stop=stop_after_attempt(self.attempts), reraise=True,
                                           wait=wait_exponential(multiplier=0.5, max=8),
                                           retry=retry_if_exception_type((aiohttp.ClientError, asyncio.TimeoutError))):
            with attempt:
                # In place: an engine may hold an adapter of this name from another store (a reset database,
                # another demo run); never serve that one under our version's name.
                async with http.post(f"{engine}/v1/load_lora_adapter",
                                     json={"lora_name": name, "lora_path": path, "load_inplace": True}) as response:
                    body = await response.text()
                    if response.status == 200 or (response.status == 400 and "already" in body.lower()):
                        return
                    if response.status >= 500:
                        raise aiohttp.ClientResponseError(response.request_info, (), status=response.status,
                                                          message=body[:300])
                    raise LoadFailed(f"{engine} refused {name}: HTTP {response.status} {body[:300]}")

    async def publish(self, version: int, path: str, *, activate: bool = True) -> Published:
        name = policies.adapter_name(version)
        try:
            seconds = await self.load(name, path)
        except (LoadFailed, aiohttp.ClientError, asyncio.TimeoutError) as exc:
            log.error("policy v%d not published: %s; the current policy keeps serving", version, exc)
            async with self.sessions() as session, session.begin():
                await policies.set_status(session, version, PolicyStatus.FAILED)
            return Published(version, False, 0.0, str(exc))
        if not activate:
            return Published(version, False, seconds)
        await self.activate(version)
        log.info("policy v%d active (loaded on %d engine(s) in %.2fs)", version, len(self.engines), seconds)
        await self.unload_drained()
        return Published(version, True, seconds)

    async def activate(self, version: int) -> None:
        """Make a loaded version the one served; the one it replaces is unloaded once drained."""
        async with self.sessions() as session, session.begin():
            previous = await policies.active_policy(session)
            await policies.activate(session, version)
        if previous.name is not None and previous.version != version:
            self._retired.append((time.monotonic(), previous.name))

    def retire(self, version: int) -> None:
        """A loaded version that will not serve (a gate kept it out): unload it once drained."""
        self._retired.append((time.monotonic(), policies.adapter_name(version)))

    async def unload_drained(self) -> None:
        """Unload versions that stopped serving more than `drain_seconds` ago (in-flight requests done)."""
        now = time.monotonic()
        due = [name for since, name in self._retired if now - since >= self.drain_seconds]
        self._retired = [(since, name) for since, name in self._retired if now - since < self.drain_seconds]
        if due:
            async with self.sessions() as session:
                serving = (await policies.active_policy(session)).name
            due = [name for name in due if name != serving]  # it may have been activated again (rollback)
        if not due:
            return
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30), headers=self.headers) as http:
            for name in due:
                await self._unload(http, name, self.engines)

    async def _unload(self, http: aiohttp.ClientSession, name: str, engines: list[str]) -> None:
        for engine in engines:
            try:
                async with http.post(f"{engine}/v1/unload_lora_adapter", json={"lora_name": name},
                                     timeout=aiohttp.ClientTimeout(total=30)):
                    pass
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                log.warning("could not unload %s from %s: %s", name, engine, exc)
