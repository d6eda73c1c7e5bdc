"""Who is calling: bearer keys resolved to a project at the edge, admin-only routes, and rollout ownership.

- Every route but `/healthz`, `/readyz` and `/openapi.json` needs a key when auth is on; `POST
  /policies/{version}/activate` needs an admin key (403 for other keys), and a project's admin key activates
  its project's own policies only (proxy/routes/policies.py). `GET /metrics` (every policy's versions and
  rewards, every engine) and `/readyz`'s details (the engines' addresses, the spool's path) are the operator's:
  the operator key's alone (`/metrics`: 403 for every other key, a project admin key's included). The table is
  proxy/edge/access.py's; docs/security.md's "Who may do what" is the whole of it.
- Key lookups (found or not) are cached in-process for `key_cache_ttl` seconds, so the request path reaches
  the database once per key and TTL, not once per call.
- A rollout belongs to the project whose key created it (`POST /rollouts` or its first recorded call). Another
  project's rollout answers 404, exactly like one that does not exist, so ids do not leak. Rollouts of no
  project (recorded before auth was on, or by the operator key) stay open to every key. Only a policy call
  about to be recorded claims an id nobody owns (`claim_for_call`, from proxy/serving.py, once the call is
  checked): a model list, a relayed engine route or a refused request under an id only reads who owns it.
- A rollout's own token (`rlr_…`) and its grader token (`rlg_…`) are looked up here like keys (the same caches,
  the same look-up limit), and held to their rollout by proxy/edge/token_scope.py, whether auth is on or off.
- The agent's Authorization header is only read here: calls are recorded from their JSON bodies, and the
  engines get the proxy's own `upstream_api_key`, if any.
"""
from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import math
import time
from collections import OrderedDict
from typing import Any

from aiohttp import web
from sqlalchemy import inspect
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from core.errors import RlproxyError
from core.settings import AuthSettings
from core.text import printable
from proxy.context import CallContext, call_context
from proxy.edge.access import (AUTH, KEY, KEY_HEADERS, OPERATOR, Access, access_for, is_openai_route,
                               is_operator_key, reads_no_rollout)
from proxy.edge.buckets import RateLimiter
from proxy.edge.token_scope import check_token_scope, presents_rollout_token
from proxy.errors import Forbidden, NotFoundError, RateLimited, StoreUnavailable, Unauthorized
from store.errors import NotYours
from store.keys import (KEY_PREFIX, KeyInfo, claim_rollout, count_active_keys, find_key, hash_key, new_key,
                        rollout_owner)
from store.rollout_tokens import find_token, is_rollout_token

log = logging.getLogger("rlproxy.auth")

_KEY_LENGTH = len(new_key())
_MISSING = object()


def is_loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere


def _admin_key(settings: AuthSettings) -> str | None:
    key = settings.admin_key.get_secret_value() if settings.admin_key is not None else ""
    return key or None  # an empty RLPROXY_ADMIN_KEY is no key


class AuthConfigError(RlproxyError):
    """The server would be open to the network without keys."""


class TTLCache:
    """A bounded LRU map whose entries expire after `ttl` seconds."""

    def __init__(self, ttl: float, maxsize: int) -> None:
        self.ttl = ttl
        self.maxsize = maxsize
        self._data: OrderedDict[str, tuple[float, Any]] = OrderedDict()

    def get(self, key: str, default: Any = _MISSING) -> Any:
        item = self._data.get(key)
        if item is None or item[0] < time.monotonic():
            return default
        self._data.move_to_end(key)
        return item[1]

    def put(self, key: str, value: Any) -> None:
        self._data[key] = (time.monotonic() + self.ttl, value)
        self._data.move_to_end(key)
        if len(self._data) > self.maxsize:
            self._data.popitem(last=False)

    def held(self, key: str) -> bool:
        """Whether `key` has an entry, expired or not (an expired one is kept until pushed out or dropped)."""
        return key in self._data

    def drop(self, key: str) -> None:
        self._data.pop(key, None)


async def active_key_count(sessions: async_sessionmaker[AsyncSession]) -> int:
    """How many unrevoked keys the database holds (0 before the keys table exists)."""
    async with sessions() as session:
        connection = await session.connection()
        if not await connection.run_sync(lambda c: inspect(c).has_table("api_keys")):
            return 0
        return await count_active_keys(session)


async def resolve_auth(settings: AuthSettings, host: str, sessions: async_sessionmaker[AsyncSession]) -> bool:
    """Whether keys are required. Raises AuthConfigError rather than serve a non-loopback host openly by
    default; an explicit `mode="off"` is obeyed (and warned about)."""
    if settings.mode != "auto":
        return settings.mode == "on"
    if _admin_key(settings):
        return True
    if await active_key_count(sessions):
        return True
    if not is_loopback(host):
        raise AuthConfigError(
            f"refusing to serve on {host} without authentication: no API keys exist and no admin key is set. "
            "Create a key with `rlproxy keys create --project NAME`, set RLPROXY_ADMIN_KEY, bind 127.0.0.1, "
            "or pass `--auth off` to serve without keys on purpose."
        )
    return False


def presented_key(request: web.Request) -> str:
    """The one key a request presents, as `Authorization: Bearer`, `x-api-key` (what Anthropic's clients send) or
    `x-goog-api-key` (Google's). Several different ones (two Authorization headers, or a bearer key and another
    x-api-key) are refused: which one a gateway in front checked and which one this proxy would read could
    differ. A key in the URL (`?key=`, which Google's API also takes) is never read: URLs are what gateways and
    shells write into their logs and history (the Gemini routes refuse it by name)."""
    tokens = set()
    for value in request.headers.getall("Authorization", ()):
        scheme, _, token = value.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            tokens.add(token.strip())
    tokens.update(value.strip() for header in KEY_HEADERS for value in request.headers.getall(header, ())
                  if value.strip())
    if not tokens:
        raise Unauthorized("missing API key: send the header 'Authorization: Bearer <key>' (or 'x-api-key', "
                           "'x-goog-api-key'; never in the URL)")
    if len(tokens) > 1:
        raise Unauthorized("several different API keys in one request: send one, as 'Authorization: Bearer <key>' "
                           "or 'x-api-key'", code="several_api_keys")
    return tokens.pop()


class Authenticator:
    def __init__(self, settings: AuthSettings) -> None:
        self.settings = settings
        self.enabled = settings.mode == "on"  # "auto" is resolved by `start()`
        self.sessions: async_sessionmaker[AsyncSession] | None = None
        admin = _admin_key(settings)
        self._admin_digest = hash_key(admin) if admin else None
        self._keys = TTLCache(settings.key_cache_ttl, maxsize=10_000)
        # Misses apart: made-up keys must not push the real ones out of the cache (and onto the database).
        self._misses = TTLCache(settings.key_cache_ttl, maxsize=10_000)
        self._lookups = RateLimiter()  # per client address: look-ups of keys the caches do not hold
        # Rollout id → project, for `key_cache_ttl` seconds at most: retention deletes rollouts and lets their
        # ids open again (store/retention.py), maybe by another project through another proxy, so an owner
        # remembered for good would let this proxy send the first project's calls into the second's rollout and
        # refuse the second's own. Bounded like a revoked key; the writer compares projects too (store/calls.py),
        # so no call lands in another project's rollout even within that time.
        self._owners = TTLCache(settings.key_cache_ttl, maxsize=100_000)

    async def start(self, sessions: async_sessionmaker[AsyncSession], host: str) -> None:
        self.sessions = sessions
        self.enabled = await resolve_auth(self.settings, host, sessions)
        if self.enabled:
            keys = await active_key_count(sessions)
            log.info("authentication is ON: every route but /healthz, /readyz and /openapi.json needs "
                     "'Authorization: Bearer <key>' (%d keys in the database%s)", keys,
                     ", plus the admin key from the settings" if self._admin_digest else "")
        elif is_loopback(host):
            log.info("authentication is OFF (no keys exist; listening on loopback %s only). "
                     "`rlproxy keys create --project NAME` turns it on at the next start", host)
        else:
            log.warning("authentication is OFF on %s (--auth off): anyone who can reach this port may call "
                        "the engines, read every rollout and activate policies", host)

    async def identify(self, request: web.Request) -> KeyInfo:
        token = presented_key(request)
        try:
            digest = hash_key(token)
        except UnicodeEncodeError:  # header bytes that are not UTF-8 arrive as lone surrogates: no key of ours
            raise Unauthorized("invalid API key (unknown or revoked)") from None
        if self._admin_digest is not None and hmac.compare_digest(digest, self._admin_digest):
            return OPERATOR
        info = self._keys.get(digest)
        if info is _MISSING and self._misses.get(digest) is _MISSING:
            info = None
            lookup = find_key if token.startswith(KEY_PREFIX) else find_token if is_rollout_token(token) else None
            if lookup is not None and len(token) == _KEY_LENGTH:  # anything else is not one of ours
                # The look-up limit is for keys nobody has shown to be real. A key this process found before is
                # checked again, when its entry expires, without it: clients of several projects often share one
                # address (a gateway, a NAT, one machine running many agents), and one of them sending made-up
                # keys would otherwise turn every other project's real keys away once a TTL.
                if not self._keys.held(digest):
                    rate = self.settings.key_lookup_rate
                    wait = self._lookups.take(f"addr:{request.remote}", rate, max(1, math.ceil(5 * rate)))
                    if wait:
                        raise RateLimited(f"too many unknown API keys from this address; retry in {wait:.2f}s",
                                          retry_after=max(1, math.ceil(wait)))
                info = await self._query(lookup, digest)
            if info is None:
                self._keys.drop(digest)  # revoked: from now on looked up as any unknown key is
            (self._keys if info is not None else self._misses).put(digest, info)
        if info is None or info is _MISSING:
            raise Unauthorized("invalid API key (unknown or revoked)")
        return info

    def is_operator(self, request: web.Request) -> bool:
        """Whether a request presents the operator key (every request does when auth is off). Compared with the
        settings' key alone: a public route asking this never looks a key up in the database, so a flood of
        probes with made-up keys costs a hash each. A missing, unreadable or other key is no operator's."""
        if not self.enabled:
            return True
        if self._admin_digest is None:
            return False
        try:
            digest = hash_key(presented_key(request))
        except (Unauthorized, UnicodeEncodeError):
            return False
        return hmac.compare_digest(digest, self._admin_digest)

    async def check_rollout(self, request: web.Request, key: KeyInfo) -> None:
        """404 for a recorded call into another project's rollout. Only reads: an id nobody owns stays free until
        a recorded call claims it (`claim`). A route that records nothing and reads no rollout data (the model
        list, count_tokens, the relayed engine routes) answers under any id as under an unused one, so that
        whether an id is taken does not show there (`reads_no_rollout`)."""
        if key.project is None or reads_no_rollout(request):
            return
        rollout_id = call_context(request).rollout_id
        if rollout_id is None:
            return
        owner = self._owners.get(rollout_id, _MISSING)
        if owner is _MISSING:
            exists, owner = await self._query(rollout_owner, rollout_id)
            if not exists:
                return
            self._remember(rollout_id, owner)
        if owner is not None and owner != key.project:
            raise NotFoundError(f"rollout {rollout_id!r} does not exist")
        if owner is None:  # the operator's: its calls would train with the operator's reward
            raise Forbidden(str(NotYours(rollout_id)))

    async def claim(self, key: KeyInfo, context: CallContext) -> None:
        """The rollout of a call that is about to be recorded becomes its project's if nobody owns it yet (404
        when another project's call claimed it since the check)."""
        if key.project is None or context.rollout_id is None:
            return
        owner = self._owners.get(context.rollout_id, _MISSING)
        if owner is _MISSING:
            owner = await self._query(claim_rollout, context.rollout_id, key.project, task_id=context.task_id,
                                      agent=context.agent, write=True)
            self._remember(context.rollout_id, owner)
        if owner is not None and owner != key.project:
            raise NotFoundError(f"rollout {context.rollout_id!r} does not exist")
        if owner is None:
            raise Forbidden(str(NotYours(context.rollout_id)))

    def _remember(self, rollout_id: str, owner: str | None) -> None:
        self._owners.put(rollout_id, owner)

    async def _query(self, function, *args, write: bool = False, **kwargs):
        assert self.sessions is not None, "Authenticator.start() was not awaited"
        try:
            async with asyncio.timeout(10):
                async with self.sessions() as session:
                    if not write:
                        return await function(session, *args, **kwargs)
                    async with session.begin():
                        return await function(session, *args, **kwargs)
        except (SQLAlchemyError, OSError, TimeoutError) as exc:
            log.warning("key or rollout lookup failed: %s", printable(str(exc)))  # the database's text, escaped
            raise StoreUnavailable("could not check the API key: the database did not answer") from None


@web.middleware
async def authenticate(request: web.Request, handler):
    auth = request.app[AUTH]
    access = access_for(request)
    if access is Access.PUBLIC or not (auth.enabled or presents_rollout_token(request)):
        # No key and no project: every reader asks with .get(), which for a name not set raises and catches a
        # KeyError inside aiohttp's Mapping (3 us, half a dozen times a recorded call); set, it is 0.1 us.
        request[KEY] = request["project"] = None
        return await handler(request)
    key = await auth.identify(request)
    request[KEY] = key
    if key.rollout is not None:
        check_token_scope(request, key)
    if access is Access.ADMIN and not key.admin:
        raise Forbidden("this route needs an admin key")
    if access is Access.OPERATOR and not is_operator_key(key):
        raise Forbidden("this route needs the operator key (--admin-key): it shows every project's data")
    request["project"] = key.project  # what the rollout routes and the recorder scope by
    return await handler(request)


def operator_caller(request: web.Request) -> bool:
    """Whether the caller of a public route holds the operator key (every caller does when auth is off): such
    routes answer everyone, and tell the operator more."""
    return request.app[AUTH].is_operator(request)


@web.middleware
async def scope_rollouts(request: web.Request, handler):
    """Another project's rollout in the path or `X-Rollout-Id` is 404 before the handler runs. Runs after the
    limits, so a caller over its rate cannot make the proxy look rollouts up."""
    key = request.get(KEY)
    if key is not None and is_openai_route(request):
        await request.app[AUTH].check_rollout(request, key)
    return await handler(request)


async def claim_for_call(request: web.Request, context: CallContext) -> None:
    """Called by a policy call once it passed every check, just before it reaches the engine (and is recorded,
    whatever the engine answers): only such a call claims a rollout id nobody owns for its key's project."""
    key = request.get(KEY)
    if key is not None:
        await request.app[AUTH].claim(key, context)
