"""`rlproxy serve` (the proxy), `rlproxy engine` (a local vLLM) and `rlproxy migrate`."""
from __future__ import annotations

from pathlib import Path

import click

from rlproxy.commands.options import auth_options, database_option, option, redact
from rlproxy.settings import AuthSettings, ProxySettings, WriterSettings


@click.command()
@option("--host", default="127.0.0.1", help="Interface to listen on.")
@option("--port", default=8400, type=int, help="Port to listen on.")
@option("--upstream", "upstreams", multiple=True,
        help="OpenAI-compatible engine base URL without /v1; repeat for replicas. Default: start a local engine.")
@database_option()
@option("--served-model", default=None, help="Model name agents ask for (default: the engine's base model).")
@option("--migrate/--no-migrate", default=True, help="Apply database migrations on start.")
@option("--client-max-size", default=64 * 1024 * 1024, type=int, help="Largest request body, bytes.")
@option("--upstream-timeout", default=600.0, type=float, help="Seconds an upstream request may take.")
@option("--spool-path", default="rlproxy-spool.jsonl", type=click.Path(path_type=Path),
        help="Where calls wait when the database is unavailable.")
@option("--durability", default="batch", type=click.Choice(["batch", "sync"]),
        help="batch: answer, then record; sync: every call is fsynced to the spool before it is answered.")
@option("--shutdown-timeout", default=30.0, type=float,
        help="Seconds in-flight requests and streams may take to finish after SIGTERM.")
@option("--air-text-action", default=None, metavar="REGEX",
        help="AIR for agents with a text tool protocol (docs/air.md): a reply in which this regex is "
             "found is a tool call, e.g. 'CALC:'. Needs --air-text-error and/or --air-text-success. Default: off.")
@option("--air-text-error", default=None, metavar="REGEX",
        help="The user/tool turn answering a text tool call is a tool_error when this regex matches at its "
             "start, e.g. 'ERROR:'.")
@option("--air-text-success", default=None, metavar="REGEX",
        help="... and a tool_success when this one does (weight: --air-tool-success).")
@option("--air-tool-success", default=0.0, type=float,
        help="AIR weight of tool_success, native and text tool calls (0: not emitted).")
@auth_options
def serve(host, port, upstreams, database_url, served_model, migrate, client_max_size, upstream_timeout,
          spool_path, durability, shutdown_timeout, air_text_action, air_text_error, air_text_success,
          air_tool_success, **auth) -> None:
    """Run the proxy."""
    from proxy.air import air_rules
    from proxy.app import run

    settings = ProxySettings(
        host=host, port=port, upstreams=tuple(u for value in upstreams for u in value.split(",") if u),
        database_url=database_url, served_model=served_model, migrate=migrate, client_max_size=client_max_size,
        upstream_timeout=upstream_timeout, shutdown_timeout=shutdown_timeout,
        air_text_action=air_text_action, air_text_error=air_text_error, air_text_success=air_text_success,
        air_tool_success=air_tool_success,
        writer=WriterSettings(spool_path=spool_path, durability=durability),
        auth=AuthSettings(**auth),
    )
    try:
        air_rules(settings)
    except ValueError as exc:
        raise click.UsageError(f"--air-text-*: {exc}") from None
    _refuse_open_network(settings)
    if settings.upstreams:
        run(settings)
        return
    from rlproxy.engine import Engine
    from rlproxy.settings import EngineSettings

    with Engine(EngineSettings()) as engine:
        run(settings.model_copy(update={"upstreams": (engine.base_url,)}))


def _refuse_open_network(settings: ProxySettings) -> None:
    """Fail at once, before an engine starts, rather than serve a non-loopback host without keys (the server
    checks again at startup, after migrating; this is the early, readable exit)."""
    import asyncio

    from sqlalchemy.exc import SQLAlchemyError

    from proxy.auth import AuthConfigError, is_loopback, resolve_auth
    from store.db import create_engine, session_factory

    if settings.auth.mode != "auto" or is_loopback(settings.host):
        return

    async def check() -> None:
        engine = create_engine(settings.database_url)
        try:
            await resolve_auth(settings.auth, settings.host, session_factory(engine))
        finally:
            await engine.dispose()

    try:
        asyncio.run(check())
    except AuthConfigError as exc:
        raise click.ClickException(str(exc)) from None
    except (SQLAlchemyError, OSError):
        pass  # the database is not reachable now: the server says so when it starts


@click.command()
@database_option()
def migrate(database_url: str) -> None:
    """Upgrade the database to the newest schema."""
    from store.migrate import upgrade

    upgrade(database_url)
    click.echo(f"database at newest schema: {redact(database_url)}")


@click.command()
@option("--model", "model_path", default=None, type=click.Path(path_type=Path),
        help="Hugging Face model folder (default: the prepared bundled model).")
@option("--host", default="127.0.0.1", help="Interface the engine listens on.")
@option("--port", default=8000, type=int, help="Port the engine listens on.")
@option("--served-model-name", default=None, help="Name the base model is served under.")
@option("--max-model-len", default=4096, type=int, help="Context length.")
@option("--kv-cache-gib", default=2, type=int, help="KV cache size on CPU, GiB.")
@option("--max-lora-rank", default=16, type=int, help="Largest LoRA rank accepted.")
@option("--max-loras", default=4, type=int, help="Adapters resident at once.")
def engine(model_path, host, port, served_model_name, max_model_len, kv_cache_gib, max_lora_rank, max_loras) -> None:
    """Start and supervise a local vLLM with runtime LoRA loading; stops cleanly on SIGTERM or Ctrl-C."""
    import signal
    import threading

    from rlproxy.engine import Engine
    from rlproxy.settings import EngineSettings

    settings = EngineSettings(model=model_path, host=host, port=port, served_model_name=served_model_name,
                              max_model_len=max_model_len, kv_cache_gib=kv_cache_gib, max_lora_rank=max_lora_rank,
                              max_loras=max_loras)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    with Engine(settings) as running:
        click.echo(f"engine ready at {running.base_url}/v1 serving {running.served_model_name!r}", err=True)
        try:
            while not stopped.wait(1.0):
                if not running.running:
                    raise click.ClickException(f"engine exited with code {running.returncode}")
        except KeyboardInterrupt:
            pass
