"""Flags of the action commands (keys, prune, migrate, export, model prepare), declared on each command; click
reads each one's `RLPROXY_<FLAG>`. The flags of serve, engine, train, demo, run and eval are made from their
settings models (core/settings/) by rlproxy/commands/flags.py."""
from __future__ import annotations

import click
from sqlalchemy.engine import make_url

from core.settings import DEFAULT_DATABASE_URL, env_name


def option(*names: str, **kwargs):
    """A click option whose environment variable is `RLPROXY_<LONG FLAG>`."""
    long = next(n for n in names if n.startswith("--")).lstrip("-").split("/")[0]
    return click.option(*names, envvar=env_name(long), show_envvar=True, show_default=True, **kwargs)


def database_option():
    return option("--database-url", default=DEFAULT_DATABASE_URL, help="SQLAlchemy async database URL.")


def redact(url: str) -> str:
    """A database URL fit to print: its password hidden."""
    return make_url(url).render_as_string(hide_password=True)
