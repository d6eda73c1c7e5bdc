"""Keys, limits and rollout scoping on one application: `install(app, settings)` from `build_app`."""
from __future__ import annotations

from aiohttp import web

from core.settings import ProxySettings
from proxy.edge import AUTH, LIMITS, Authenticator, Limits, authenticate, enforce_limits, scope_rollouts
from proxy.metrics import ProxyMetrics
from proxy.state import STATE


def install(app: web.Application, settings: ProxySettings, metrics: ProxyMetrics | None = None) -> None:
    """Adds, inside the error middleware: who is calling → rate and size limits → rollout ownership. Whether
    keys are needed is settled at startup, once the database is reachable (`Authenticator.start`)."""
    app[AUTH] = Authenticator(settings.auth)
    app[LIMITS] = Limits(settings, metrics)
    app.middlewares.extend([authenticate, enforce_limits, scope_rollouts])

    async def start_auth(app: web.Application) -> None:  # on_startup runs after the cleanup contexts started
        await app[AUTH].start(app[STATE].sessions, settings.host)

    app.on_startup.append(start_auth)
