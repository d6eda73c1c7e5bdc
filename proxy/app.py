"""Building and running the proxy application: its routes, the middleware in the order proxy/checks.py names, and
what it starts and stops with it (the database, the writer, the engines' fleet, the OTLP decoders)."""
from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from core.log_redaction import redact_keys_in
from core.settings import ProxySettings
from engine import lifecycle
from engine.adapters import AdapterError
from engine.fleet import Rejoiner
from migrations.apply import upgrade_async
from proxy.api import register
from proxy.boundary import RequestBoundary
from proxy.checks import install as install_checks
from proxy.checks import middlewares
from proxy.dialects import DIALECTS
from proxy.edge import SERVER_SETTINGS, Router, use_guarded_handler
from proxy.ingest import RewardIngest
from proxy.metrics import ProxyMetrics
from proxy.otlp import decoders_of
from proxy.policy import PolicyRouter
from proxy.recording import CaptureWriter, air_rules, automatic_rewards
from proxy.routes import all_endpoints, documented_endpoints, passthrough
from proxy.routes.docs import BUILT, DOCUMENTED
from proxy.routes.ops import READINESS, ReadinessLooks
from proxy.serving import CompletionServing
from proxy.state import STATE, ProxyState
from proxy.tenancy import ModelAccess
from proxy.upstream import UpstreamPool
from store.db import open_database, session_factory

log = logging.getLogger("rlproxy.proxy")


def build_app(settings: ProxySettings, metrics: ProxyMetrics | None = None) -> web.Application:
    redact_keys_in()  # aiohttp logs the head of a request it cannot parse, keys included
    use_guarded_handler(settings.max_connections)  # and answers it with that head: proxy/edge/http_server.py
    app = web.Application(middlewares=middlewares(settings),  # in the order proxy/checks.py names
                          client_max_size=settings.client_max_size, router=Router(),
                          handler_args={**SERVER_SETTINGS, "keepalive_timeout": settings.header_timeout})
    register(app, all_endpoints())
    app[DOCUMENTED] = documented_endpoints()
    app[BUILT] = {}  # the OpenAPI document, built once per served model name
    app[READINESS] = ReadinessLooks()  # /readyz's shared look
    passthrough.add_routes(app)  # the engine's read-only routes, relayed (proxy/edge/engine_routes.py)
    metrics = metrics or ProxyMetrics()
    install_checks(app, settings, metrics)
    app.cleanup_ctx.append(_lifecycle(settings, metrics))
    app.cleanup_ctx.append(decoders_of(settings.ingest))  # OTLP exports are decoded in worker processes
    app.on_shutdown.append(_draining(settings))
    return app


def _lifecycle(settings: ProxySettings, metrics: ProxyMetrics):
    async def lifecycle(app: web.Application):
        if settings.migrate:
            await upgrade_async(settings.database_url)
        database = open_database(settings.database_url)
        sessions = session_factory(database)
        # First: it takes the spool, which another process may hold (then nothing else is left to close).
        writer = CaptureWriter(sessions, settings.writer, metrics,
                               after_write=automatic_rewards(air_rules(settings), metrics))
        upstreams = UpstreamPool(settings.upstreams, timeout=settings.upstream_timeout,
                                 connect_attempts=settings.upstream_connect_attempts,
                                 api_key=_secret(settings.auth.upstream_api_key))
        await upstreams.start()
        await upstreams.refresh_health()
        router = PolicyRouter(sessions, settings.served_model, settings.routing(), upstreams)
        await writer.start()
        access = ModelAccess(router, upstreams)
        boundary = RequestBoundary(settings.allow_request_fields, settings.auth.max_tokens, settings.auth.max_n,
                                   media_urls=settings.allow_media_urls)
        serving = {route: CompletionServing(dialect, upstreams, router, writer, metrics, access, boundary,
                                            redact=settings.redaction.redact_content,
                                            logprobs_mode=settings.engine_logprobs_mode,
                                            rollout_sampling=settings.sampling_rules())
                   for route, dialect in DIALECTS.items()}
        ingest = RewardIngest(settings, sessions, writer, metrics, router)
        app[STATE] = ProxyState(settings, database, sessions, metrics, upstreams, router, writer, serving, access,
                                boundary, ingest)
        await router.start(settings.policy_refresh_interval)
        health = asyncio.create_task(_watch_engines(app[STATE]), name="engine-health")
        rejoiner = Rejoiner(sessions, upstreams.adapters, metrics=metrics.fleet)
        rejoining = asyncio.create_task(_rejoin_withheld(app[STATE], rejoiner), name="fleet-rejoin")
        try:
            yield
        finally:
            # Requests in flight have finished (or met `shutdown_timeout`): store what they recorded (what the
            # database does not take stays in the spool), then let go of the engines and the database.
            health.cancel()
            rejoining.cancel()
            await rejoiner.close()
            await router.close()
            await writer.close()
            await upstreams.close()
            await database.dispose()
            log.info("stopped")

    return lifecycle


def _draining(settings: ProxySettings):
    async def draining(app: web.Application) -> None:
        """On SIGTERM the listening socket is closed already; requests and streams in flight may finish."""
        in_flight = int(app[STATE].metrics.in_flight._value.get()) if STATE in app else 0
        log.info("shutting down: %d requests in flight get up to %.0f s to finish", in_flight,
                 settings.shutdown_timeout)

    return draining


async def _watch_engines(state: ProxyState, interval: float = 5.0) -> None:
    """Keep replica health and the base model name current (an engine may start after the proxy), and put
    the serving adapters back on a replica that lost them (it restarted)."""
    while True:
        await state.upstreams.refresh_health()
        try:
            await _restore_adapters(state)
        except Exception as exc:  # noqa: BLE001 — the next look tries again
            log.warning("could not check the engines' adapters: %s", exc)
        base = state.upstreams.base_model()
        if base and state.router.base_model != base:
            state.router.base_model = base
            if state.router.served_model is None:
                state.router.served_model = base
            log.info("engine serves base model %r; agents ask for %r", base, state.router.served_model)
        state.metrics.observe_policies(state.router)
        await asyncio.sleep(interval if state.router.base_model else 0.5)


async def _rejoin_withheld(state: ProxyState, rejoiner: Rejoiner) -> None:
    """Retry this proxy's replicas that are out of rotation for a serving version (engine/fleet.py), following
    what the policy router last read."""
    ours = {r.url for r in state.upstreams.replicas}
    while True:
        rejoiner.follow({version: [r for r in urls if r in ours] for version, urls in state.router.withheld.items()})
        await asyncio.sleep(state.settings.policy_refresh_interval)


async def _restore_adapters(state: ProxyState) -> None:
    """A replica that restarted comes back without the adapters loaded at runtime; without this its rollouts
    would get 404 until the next publish. It is verified as at publish (engine/fleet.py); one that fails is
    out of rotation for the version and retried by `_rejoin_withheld`."""
    for version, name, path in [(p.version, p.name, getattr(p, "path", None)) for p in state.router.serving()]:
        out = state.router.withheld.get(version, {})
        # Lost, or held from another folder than the version's: the name alone says nothing of the weights (an
        # engine reached otherwise than through the proxy could have loaded anything under it).
        lost = [r.url for r in state.upstreams.replicas
                if r.healthy and r.base_models and r.url not in out
                and (name not in r.adapters or (path and r.adapters[name] and r.adapters[name] != path))]
        if not lost:
            continue
        try:
            await lifecycle.ensure_loaded(state.sessions, state.upstreams.adapters(lost), version,
                                          metrics=state.metrics.fleet)
        except AdapterError as exc:
            log.error("engine(s) %s lost %s and could not load it again: %s", ", ".join(lost), name, exc)
            continue
        for replica in state.upstreams.replicas:
            if replica.url in lost:
                replica.adapters[name] = path
        log.warning("engine(s) %s had lost %s (restarted?): loaded it again", ", ".join(lost), name)


def _secret(value) -> str | None:
    return value.get_secret_value() if value is not None else None


def run(settings: ProxySettings) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    web.run_app(build_app(settings), host=settings.host, port=settings.port, handler_cancellation=True,
                shutdown_timeout=settings.shutdown_timeout, access_log=None, print=lambda msg: log.info(msg))
