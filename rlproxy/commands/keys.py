"""`rlproxy keys`: API keys per project."""
from __future__ import annotations

import asyncio
import logging

import click

from migrations.apply import upgrade
from rlproxy.commands.options import database_option, option
from store.db import create_engine, session_factory
from store.errors import NotFound
from store.keys import create_key, list_keys, revoke_key


@click.group()
def keys() -> None:
    """API keys: each belongs to a project; admin keys may also activate policies and read metrics."""


def _run_with_session(database_url: str, work):
    """Migrate, then run `work(session)` in one transaction and return its result."""
    logging.getLogger("alembic").setLevel(logging.WARNING)  # keep the output to the key itself
    upgrade(database_url)

    async def go():
        engine = create_engine(database_url)
        try:
            async with session_factory(engine)() as session, session.begin():
                return await work(session)
        finally:
            await engine.dispose()

    return asyncio.run(go())


@keys.command("create")
@option("--project", required=True, help="Project the key belongs to (created if new).")
@option("--admin", is_flag=True,
        help="Also allow admin routes (activating its project's own policies, metrics).")
@option("--label", default=None, help="A note shown by `keys list`.")
@option("--rate-limit", default=None, type=float,
        help="Requests per second for this key (default: the server's).")
@option("--rate-burst", default=None, type=int, help="Burst for this key (default: the server's).")
@database_option()
def keys_create(project, admin, label, rate_limit, rate_burst, database_url) -> None:
    """Create a key and print it once (only its SHA-256 is stored)."""
    async def work(session):
        key, row = await create_key(session, project, admin=admin, label=label, rate_limit=rate_limit,
                                    rate_burst=rate_burst)
        return key, row.id

    key, key_id = _run_with_session(database_url, work)
    click.echo(f"created {'admin ' if admin else ''}key {key_id} for project {project!r}; it is shown only "
               "now — store it:", err=True)
    click.echo(key)


@keys.command("list")
@option("--project", default=None, help="Only this project's keys.")
@database_option()
def keys_list(project, database_url) -> None:
    """Every key: id, project, admin, created, revoked (never the key itself)."""
    rows = _run_with_session(database_url, lambda session: list_keys(session, project))
    click.echo(f"{'id':<14}{'project':<24}{'admin':<7}{'created':<22}{'revoked':<22}label")
    for row in rows:
        when = lambda t: t.strftime("%Y-%m-%d %H:%M:%S") if t else "-"  # noqa: E731
        click.echo(f"{row.id:<14}{row.project:<24}{'yes' if row.admin else 'no':<7}{when(row.created_at):<22}"
                   f"{when(row.revoked_at):<22}{row.label or ''}")


@keys.command("revoke")
@click.argument("key_id")
@database_option()
def keys_revoke(key_id, database_url) -> None:
    """Revoke a key by its id (see `keys list`); proxies refuse it within their --key-cache-ttl."""
    try:
        row = _run_with_session(database_url, lambda session: revoke_key(session, key_id))
    except NotFound as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"revoked key {row.id} of project {row.project!r}")
