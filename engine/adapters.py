"""The engines' runtime LoRA routes: the one place rlproxy lists, loads and unloads an adapter.

    adapters = EngineAdapters(["http://engine-a:8000", "http://engine-b:8000"], api_key=key)
    await adapters.load("rlproxy-v3-9f2a61c0", "/adapters/v3")   # on every replica, with the weights in that folder
    await adapters.unload("rlproxy-v2-51be07d3")                 # from every replica

When a version's adapter is loaded or unloaded, and which `replace` it needs, is engine/lifecycle.py's
business; the trainer, the gates, the proxy's activate route and restore loop and the demo all go through it.

One success rule: an operation succeeded when the engine answered 200 to it, and an unload also when the
engine says it has no adapter of that name (404 naming it: what was asked is true). Every other outcome
raises an `AdapterError`:

    RlproxyError
    └── AdapterError
        ├── EngineUnavailable   no answer, a timeout, or 502/503/504, after `attempts` tries
        ├── AdapterRefused      the engine answered no: a folder that is not an adapter (400/404), an adapter
        │                       it cannot take (500, e.g. a rank above --max-lora-rank), a wrong key (401)
        └── ReplicasFailed      a load or unload on several replicas where some failed; `.failures` by engine
            ├── LoadFailed
            └── UnloadFailed

Reload semantics, for vLLM 0.32:

* vLLM refuses to load a name it holds already (400) unless the request sets `load_inplace`. rlproxy never
  sets it: vLLM keeps the flag on the adapter and then re-reads the folder on every engine step (checked on
  0.32: after an in-place load, swapping the folder's weights on disk changed the very next answer, while
  an adapter loaded without the flag kept its weights). That is a load per step, and an adapter whose
  weights are whatever the folder holds at that moment.
* So replacing what a replica holds under a name is unload, then load. The new load gets a new internal
  id, so no copy of the earlier weights cached in the engine can answer for it, and vLLM keys prefix-cache
  blocks by adapter name and folder, so blocks computed with another folder's weights are not reused.
  (Blocks of the same folder with other contents would be: rlproxy never rewrites a recorded version's
  folder, and a publish always replaces, see lifecycle.py.)
* `replace=True` does that on every replica, whatever it holds. It is for an adapter that serves no traffic
  yet: between the unload and the load its name is unknown to that replica.
* `replace=False` keeps a replica's copy when the replica lists the name from exactly this folder, and
  replaces it when it lists it from another one. It is for an adapter that serves now.
* An adapter the engine lost (it restarted) is not listed, and either way it is loaded again.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence

import aiohttp
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from core.errors import RlproxyError

log = logging.getLogger("engine.adapters")

LOAD_ROUTE = "/v1/load_lora_adapter"
UNLOAD_ROUTE = "/v1/unload_lora_adapter"
MODELS_ROUTE = "/v1/models"
COMPLETIONS_ROUTE = "/v1/completions"
UNAVAILABLE = frozenset({502, 503, 504})  # a proxy or load balancer in front of an engine that is not up


class AdapterError(RlproxyError):
    """An adapter operation did not happen. `engine` and `name` say where and which, when known."""

    def __init__(self, message: str, *, engine: str | None = None, name: str | None = None) -> None:
        super().__init__(message)
        self.engine = engine
        self.name = name


class EngineUnavailable(AdapterError):
    """The engine did not answer (connection refused, timeout, 502/503/504) after the bounded retries."""


class AdapterRefused(AdapterError):
    """The engine answered, and not with success; `status` is its HTTP status."""

    def __init__(self, message: str, *, status: int, engine: str | None = None,
                 name: str | None = None) -> None:
        super().__init__(message, engine=engine, name=name)
        self.status = status


class ReplicasFailed(AdapterError):
    """Some replicas failed; `failures` maps each such engine to its own error."""

    def __init__(self, message: str, failures: dict[str, AdapterError], *, name: str) -> None:
        super().__init__(message, name=name)
        self.failures = failures


class LoadFailed(ReplicasFailed):
    """The adapter is not loaded on every replica (with replace=True, on none: partial loads are undone)."""


class UnloadFailed(ReplicasFailed):
    """The adapter may still be loaded on the replicas named in `failures`."""


class EngineAdapters:
    """The adapter routes of a fixed set of engine replicas (base URLs, no /v1; none: every operation is
    done at once, for a trainer that only records versions).

    `http`: a session to send through (the proxy passes its pooled one, which carries the engine key
    already); without it each operation opens its own. `attempts`: tries per request while the engine is
    unavailable, with exponential backoff."""

    def __init__(self, engines: Sequence[str], *, api_key: str | None = None,
                 http: aiohttp.ClientSession | None = None, attempts: int = 3,
                 load_timeout: float = 120.0) -> None:
        self.engines = tuple(e.rstrip("/") for e in engines)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = http
        self.attempts = max(1, attempts)
        self.load_timeout = load_timeout

    async def listed(self) -> dict[str, dict[str, str]]:
        """Per engine, the adapters it holds: name -> the folder it was loaded from."""
        async with self._client() as http:
            found = await asyncio.gather(*(self._listed(http, engine) for engine in self.engines))
        return dict(zip(self.engines, found))

    async def load(self, name: str, path: str, *, replace: bool = True,
                   engines: Sequence[str] | None = None) -> float:
        """Make every replica (or those in `engines`) hold `name` loaded from `path`; returns the seconds it
        took. Raises LoadFailed. `replace`: see the module's docstring."""
        targets = self._targets(engines)
        began = time.perf_counter()
        async with self._client() as http:
            # Every replica's answer is awaited, so none is still loading when this gives up.
            results = await asyncio.gather(*(self._load_one(http, e, name, path, replace) for e in targets),
                                           return_exceptions=True)
            failures = _failures(targets, results)
            if failures and replace:
                # Replace is for an adapter that serves nothing yet: copies some replicas took never will.
                await self._unload_quietly(http, name, [e for e in targets if e not in failures])
        if failures:
            raise LoadFailed(f"{name} from {path} is not loaded on every engine: "
                             + "; ".join(str(f) for f in failures.values()), failures, name=name)
        return time.perf_counter() - began

    async def unload(self, name: str, *, engines: Sequence[str] | None = None) -> None:
        """Make every replica (or those in `engines`) hold no adapter `name`. Raises UnloadFailed."""
        targets = self._targets(engines)
        async with self._client() as http:
            results = await asyncio.gather(*(self._unload_one(http, e, name) for e in targets),
                                           return_exceptions=True)
        failures = _failures(targets, results)
        if failures:
            raise UnloadFailed(f"{name} may still be loaded: " + "; ".join(str(f) for f in failures.values()),
                               failures, name=name)

    async def complete(self, engine: str, body: dict, *, timeout: float = 60.0) -> dict:
        """One replica's JSON answer to a completion request (engine/fleet.py's probe of a loaded adapter), sent
        with this client's key and retries. Raises AdapterRefused for any answer but 200 with a JSON object."""
        engine = engine.rstrip("/")
        async with self._client() as http:
            status, text = await self._request(http, "POST", engine, COMPLETIONS_ROUTE, body, timeout)
        try:
            answer = json.loads(text) if status == 200 else None
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise AdapterRefused(f"{engine} did not complete with {body.get('model')}: HTTP {status} {text[:300]}",
                                 status=status, engine=engine, name=body.get("model"))
        return answer

    # --- one replica ------------------------------------------------------------------------------------

    async def _load_one(self, http: aiohttp.ClientSession, engine: str, name: str, path: str,
                        replace: bool) -> None:
        if not replace:
            resident = (await self._listed(http, engine)).get(name)
            if resident == path:
                return
            replace = resident is not None  # held from another folder: other weights under this name
        for _ in range(3):
            if replace:
                await self._unload_one(http, engine, name)
            status, body = await self._request(http, "POST", engine, LOAD_ROUTE,
                                               {"lora_name": name, "lora_path": path}, self.load_timeout)
            if status == 200:
                return
            if not (status == 400 and "already" in body.lower()):
                raise AdapterRefused(f"{engine} refused to load {name} from {path}: HTTP {status} "
                                     f"{body[:300]}", status=status, engine=engine, name=name)
            # Another client loaded it between our look and our load (say, two proxies restoring one replica).
            if not replace and (await self._listed(http, engine)).get(name) == path:
                return
            replace = True
        raise AdapterRefused(f"{engine} kept getting {name} loaded by another client", status=400,
                             engine=engine, name=name)

    async def _unload_one(self, http: aiohttp.ClientSession, engine: str, name: str) -> None:
        status, body = await self._request(http, "POST", engine, UNLOAD_ROUTE, {"lora_name": name}, 30.0)
        # A 404 naming the adapter is "not loaded", what was asked; a bare 404 is an engine without the route.
        if status == 200 or (status == 404 and name in body):
            return
        raise AdapterRefused(f"{engine} refused to unload {name}: HTTP {status} {body[:300]}", status=status,
                             engine=engine, name=name)

    async def _unload_quietly(self, http: aiohttp.ClientSession, name: str, engines: list[str]) -> None:
        for engine in engines:
            try:
                await self._unload_one(http, engine, name)
            except AdapterError as exc:
                log.warning("could not unload %s: %s", name, exc)

    async def _listed(self, http: aiohttp.ClientSession, engine: str) -> dict[str, str]:
        status, body = await self._request(http, "GET", engine, MODELS_ROUTE, None, 10.0)
        if status != 200:
            raise AdapterRefused(f"{engine} did not list its models: HTTP {status} {body[:300]}",
                                 status=status, engine=engine)
        try:
            models = json.loads(body)["data"]
        except (ValueError, KeyError, TypeError):
            raise AdapterRefused(f"{engine} listed its models in an unknown form: {body[:300]}",
                                 status=status, engine=engine) from None
        # Adapters name the base model as parent; the base model has none (or itself).
        return {m["id"]: m.get("root") for m in models if m.get("parent") not in (None, m["id"])}

    async def _request(self, http: aiohttp.ClientSession, method: str, engine: str, route: str,
                       body: dict | None, timeout: float) -> tuple[int, str]:
        async for attempt in AsyncRetrying(stop=stop_after_attempt(self.attempts), reraise=True,
                                           wait=wait_exponential(multiplier=0.5, max=8),
                                           retry=retry_if_exception_type(EngineUnavailable)):
            with attempt:
                try:
                    async with http.request(method, engine + route, json=body, headers=self.headers,
                                            timeout=aiohttp.ClientTimeout(total=timeout)) as response:
                        status, text = response.status, (await response.read()).decode(errors="replace")
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    raise EngineUnavailable(f"{engine} did not answer {route}: {exc!r}",
                                            engine=engine) from exc
                if status in UNAVAILABLE:
                    raise EngineUnavailable(f"{engine} is unavailable ({route}: HTTP {status})",
                                            engine=engine)
                return status, text
        raise AssertionError("unreachable")

    def _targets(self, engines: Sequence[str] | None) -> tuple[str, ...]:
        return self.engines if engines is None else tuple(e.rstrip("/") for e in engines)

    @contextlib.asynccontextmanager
    async def _client(self) -> AsyncIterator[aiohttp.ClientSession]:
        if self.http is not None:
            yield self.http
            return
        async with aiohttp.ClientSession() as http:
            yield http


def _failures(engines: Sequence[str], results: list) -> dict[str, AdapterError]:
    """The replicas whose operation raised; anything but an AdapterError is a bug and is raised as it is."""
    failures = {}
    for engine, result in zip(engines, results):
        if isinstance(result, AdapterError):
            failures[engine] = result
        elif isinstance(result, BaseException):
            raise result
    return failures
