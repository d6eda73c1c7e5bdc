"""Operations: `GET /healthz` (process up), `GET /readyz` (an engine reachable and calls recorded: the capture
writer running, the spool writable when calls pass through it, and the database answering or the spool writable
while it is down; what it looked at only for the operator key), `GET /metrics` (the operator key only).

Both are the whole proxy's, not a project's: `/metrics` carries every policy's versions and per-version reward
histograms (other projects' data), `/readyz`'s details the engines' addresses and the spool's path (the
operator's topology). A project's key, admin or not, gets 403 on `/metrics` (proxy/edge/access.py `OPERATOR_ROUTES`)
and from `/readyz` what a probe without a key gets: ready or not."""
from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from proxy.edge import operator_caller
from proxy.bodies import Health, Ready, SpoolState
from proxy.api import Answer, Endpoint
from proxy.state import state
from store.db import ping


async def healthz(request: web.Request) -> web.Response:
    return Health(status="ok").reply()


@dataclass(frozen=True)
class Readiness:
    database: bool
    engines: dict[str, bool]
    spool_problem: str | None
    ready: bool


# Probes answered from one look for this long: anyone may call /readyz, as often as they like. A look that found
# the proxy not ready is kept a tenth as long, so recovery shows at once (and an outage's flood still shares looks).
READINESS_TTL_S = 1.0
NOT_READY_TTL_S = 0.1


class ReadinessLooks:
    """One look at the database, the engines and the spool, shared by every /readyz while it is fresh (each look
    opens a database connection, asks every engine and writes a probe file: a flood of /readyz would otherwise
    take the pool the writer needs and mark engines unhealthy by timeouts)."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.at = -math.inf
        self.last: Readiness | None = None

    async def current(self, app) -> Readiness:
        async with self.lock:
            fresh_for = READINESS_TTL_S if self.last is not None and self.last.ready else NOT_READY_TTL_S
            if self.last is None or time.monotonic() - self.at >= fresh_for:
                self.last, self.at = await _look(app), time.monotonic()
            return self.last


READINESS = web.AppKey("rlproxy_readiness", ReadinessLooks)


async def _look(app) -> Readiness:
    database = True
    try:
        async with asyncio.timeout(3):
            async with app.database.connect() as conn:
                await ping(conn)
    except Exception:  # noqa: BLE001 — any failure means not ready
        database = False
    await app.upstreams.refresh_health()
    engines = {r.url: r.healthy for r in app.upstreams.replicas}
    writer = app.writer
    spool_problem = await asyncio.to_thread(writer.spool.problem)  # it writes a probe file
    # Calls keep being served while the database is down: they wait in the spool, so that is still ready. With
    # `spool` or `sync` durability every call passes through the spool: one it cannot keep is answered 503.
    recording = spool_problem is None if writer.durable else (database or spool_problem is None)
    return Readiness(database, engines, spool_problem, recording and writer.running and any(engines.values()))


async def readyz(request: web.Request) -> web.Response:
    app = state(request)
    look = await request.app[READINESS].current(app)
    status = 200 if look.ready else 503
    shown = "ready" if look.ready else "unavailable"
    if not operator_caller(request):  # where the engines and the spool are is the operator's business alone
        return Ready(status=shown).reply(status=status)
    writer = app.writer
    answer = Ready(status=shown, database=look.database, writer=writer.running, engines=look.engines,
                   spooled_calls=writer.awaiting_replay, policy=app.router.active.version,
                   spool=SpoolState(pending=writer.awaiting_replay, spooling=writer.spooling,
                                    durability=writer.settings.durability, path=str(writer.spool.path),
                                    writable=look.spool_problem is None, problem=look.spool_problem))
    return answer.reply(status=status)


async def metrics(request: web.Request) -> web.Response:
    app = state(request)
    app.metrics.writer_queue.set(app.writer.queue.qsize())
    for replica in app.upstreams.replicas:
        app.metrics.engine_up.labels(replica.url).set(1 if replica.healthy else 0)
    app.metrics.observe_policies(app.router)  # as of the router's last look (replicas out of rotation too)
    return web.Response(body=app.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})


ENDPOINTS = [
    Endpoint("get", "/healthz", healthz, "The process is up", {200: Answer("Up.", Health)}, access="public"),
    Endpoint("get", "/readyz", readyz, "The database and at least one engine answer",
             {200: Answer("Ready.", Ready), 503: Answer("Not ready.", Ready)}, access="public"),
    Endpoint("get", "/metrics", metrics, "Prometheus metrics; the operator key only when auth is on",
             {200: Answer("Prometheus text format.", text=True)}, access="admin"),
]
