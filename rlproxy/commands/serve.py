"""`rlproxy serve` (the proxy), `rlproxy engine` (a local vLLM) and `rlproxy migrate`."""
from __future__ import annotations

import asyncio
import errno
import signal
import threading

import click
from sqlalchemy.exc import SQLAlchemyError

from core.settings import EngineSettings, ProxySettings
from core.settings.maintenance import MigrateSettings
from engine.command import family_plan, port_free
from engine.local import Engine
from migrations.apply import upgrade
from proxy.recording import air_rules
from proxy import app
from proxy.edge import AuthConfigError, is_loopback, resolve_auth
from proxy.recording import SpoolInUse
from rlproxy.commands.flags import Flags
from rlproxy.commands.options import redact
from rlproxy.extras import require
from store.db import open_database, session_factory

SERVE_FLAGS = Flags(ProxySettings)


@click.command()
@SERVE_FLAGS
def serve(**params) -> None:
    """Run the proxy."""
    settings = SERVE_FLAGS.build(params)
    if not settings.upstreams:
        require("serve (without --upstream: it starts a local engine)", "engine")
    try:
        air_rules(settings)
    except ValueError as exc:
        raise click.UsageError(f"--air-text-*: {exc}") from None
    _refuse_open_network(settings)
    if not port_free(settings.host, settings.port):  # said before a local engine takes minutes to start
        raise click.ClickException(_port_taken(settings))
    try:
        if settings.upstreams:
            app.run(settings)
            return
        with Engine(engine_settings(settings)) as engine:
            app.run(settings.model_copy(update={"upstreams": (engine.base_url,)}))
    except SpoolInUse as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        raise click.ClickException(_port_taken(settings)) from None  # taken since the check above


def _port_taken(settings: ProxySettings) -> str:
    return (f"{settings.host}:{settings.port} is taken (another process listens there): stop it or give --port "
            "another one")


def engine_settings(settings: ProxySettings) -> EngineSettings:
    """The local engine's settings, with room for every named policy's adapters: an active version and a
    candidate or canary each, plus one stopped version draining. It requires the key the proxy sends
    (upstream_api_key), which the trainer reads from the same variable (RLPROXY_UPSTREAM_API_KEY)."""
    default = EngineSettings()
    key = settings.auth.upstream_api_key
    if key is None:
        click.echo("rlproxy serve: the local engine takes no key (set RLPROXY_UPSTREAM_API_KEY for rlproxy serve and "
                   "rlproxy train): any process on this machine that reaches its port can load weights under a "
                   "served adapter's name", err=True)
    return default.model_copy(update={"max_loras": max(default.max_loras, 2 * len(settings.routing().policies()) + 1),
                                      "engine_key": key})


def _refuse_open_network(settings: ProxySettings) -> None:
    """Fail at once, before an engine starts, rather than serve a non-loopback host without keys (the server
    checks again at startup, after migrating; this is the early, readable exit)."""
    if settings.auth.mode != "auto" or is_loopback(settings.host):
        return

    async def check() -> None:
        database = open_database(settings.database_url)
        try:
            await resolve_auth(settings.auth, settings.host, session_factory(database))
        finally:
            await database.dispose()

    try:
        asyncio.run(check())
    except AuthConfigError as exc:
        raise click.ClickException(str(exc)) from None
    except (SQLAlchemyError, OSError):
        pass  # the database is not reachable now: the server says so when it starts


MIGRATE_FLAGS = Flags(MigrateSettings)


@click.command()
@MIGRATE_FLAGS
def migrate(**params) -> None:
    """Upgrade the database to the newest schema."""
    settings = MIGRATE_FLAGS.build(params)
    upgrade(settings.database_url)
    click.echo(f"database at newest schema: {redact(settings.database_url)}")


ENGINE_FLAGS = Flags(EngineSettings)


@click.command()
@ENGINE_FLAGS
def engine(**params) -> None:
    """Start and supervise a local vLLM with runtime LoRA loading; stops cleanly on SIGTERM or Ctrl-C."""
    require("engine", "engine")
    settings = ENGINE_FLAGS.build(params)
    if settings.engine_key is None:
        click.echo("rlproxy engine: no --engine-key (RLPROXY_ENGINE_KEY): any process that reaches this port can "
                   "load weights under a served adapter's name", err=True)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    engine_process = Engine(settings)
    click.echo(f"rlproxy engine: {family_plan(settings, engine_process.model_path).describe()}", err=True)
    with engine_process as running:
        click.echo(f"engine ready at {running.base_url}/v1 serving {running.served_model_name!r}", err=True)
        try:
            while not stopped.wait(1.0):
                if not running.running:
                    raise click.ClickException(f"engine exited with code {running.returncode}")
        except KeyboardInterrupt:
            pass
