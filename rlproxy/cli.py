"""The `rlproxy` command. Every flag also reads `RLPROXY_<FLAG>` from the environment."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from rlproxy.settings import DEFAULT_DATABASE_URL, ProxySettings, WriterSettings


def env(name: str) -> str:
    return "RLPROXY_" + name.upper().replace("-", "_")


def option(*names: str, **kwargs):
    """A click option whose environment variable is `RLPROXY_<LONG FLAG>`."""
    long = next(n for n in names if n.startswith("--")).lstrip("-").split("/")[0]
    return click.option(*names, envvar=env(long), show_envvar=True, show_default=True, **kwargs)


def database_option():
    return option("--database-url", default=DEFAULT_DATABASE_URL, help="SQLAlchemy async database URL.")


def _logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def main(verbose: bool) -> None:
    """rlproxy: an OpenAI-compatible proxy that records every policy call and trains what it serves."""
    _logging(verbose)


@main.command()
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
def serve(host, port, upstreams, database_url, served_model, migrate, client_max_size, upstream_timeout,
          spool_path) -> None:
    """Run the proxy."""
    from proxy.app import run

    settings = ProxySettings(
        host=host, port=port, upstreams=tuple(u for value in upstreams for u in value.split(",") if u),
        database_url=database_url, served_model=served_model, migrate=migrate, client_max_size=client_max_size,
        upstream_timeout=upstream_timeout, writer=WriterSettings(spool_path=spool_path),
    )
    if settings.upstreams:
        run(settings)
        return
    from rlproxy.engine import Engine
    from rlproxy.settings import EngineSettings

    with Engine(EngineSettings()) as engine:
        run(settings.model_copy(update={"upstreams": (engine.base_url,)}))


@main.command()
@database_option()
def migrate(database_url: str) -> None:
    """Upgrade the database to the newest schema."""
    from store.migrate import upgrade

    upgrade(database_url)
    click.echo(f"database at newest schema: {_redact(database_url)}")


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


if __name__ == "__main__":
    main()
