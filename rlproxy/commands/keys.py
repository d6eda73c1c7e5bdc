"""`rlproxy keys`: API keys per project."""
from __future__ import annotations

import asyncio
import logging

import click

from core.settings.maintenance import KeysCreateSettings, KeysListSettings, KeysRevokeSettings
from migrations.apply import upgrade
from rlproxy.commands.flags import Flags
from store.db import short_session
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
        async with short_session(database_url) as sessions, sessions() as session, session.begin():
            return await work(session)

    return asyncio.run(go())


CREATE_FLAGS = Flags(KeysCreateSettings)
LIST_FLAGS = Flags(KeysListSettings)
REVOKE_FLAGS = Flags(KeysRevokeSettings)


@keys.command("create")
@CREATE_FLAGS
def keys_create(**params) -> None:
    """Create a key and print it once (only its SHA-256 is stored)."""
    settings = CREATE_FLAGS.build(params)

    async def work(session):
        key, row = await create_key(session, settings.project, admin=settings.admin, label=settings.label,
                                    rate_limit=settings.rate_limit, rate_burst=settings.rate_burst,
                                    eval=settings.eval)
        return key, row.id

    key, key_id = _run_with_session(settings.database_url, work)
    kind = ("admin " if settings.admin else "") + ("evaluation " if settings.eval else "")
    click.echo(f"created {kind}key {key_id} for project {settings.project!r}; it is "
               "shown only now — store it:", err=True)
    click.echo(key)


@keys.command("list")
@LIST_FLAGS
def keys_list(**params) -> None:
    """Every key: id, project, admin, eval, created, revoked (never the key itself)."""
    settings = LIST_FLAGS.build(params)
    rows = _run_with_session(settings.database_url, lambda session: list_keys(session, settings.project))
    click.echo(f"{'id':<14}{'project':<24}{'admin':<7}{'eval':<6}{'created':<22}{'revoked':<22}label")
    for row in rows:
        when = lambda t: t.strftime("%Y-%m-%d %H:%M:%S") if t else "-"  # noqa: E731
        click.echo(f"{row.id:<14}{row.project:<24}{'yes' if row.admin else 'no':<7}{'yes' if row.eval else 'no':<6}"
                   f"{when(row.created_at):<22}{when(row.revoked_at):<22}{row.label or ''}")


@keys.command("revoke")
@click.argument("key_id")
@REVOKE_FLAGS
def keys_revoke(key_id, **params) -> None:
    """Revoke a key by its id (see `keys list`); proxies refuse it within their --key-cache-ttl."""
    settings = REVOKE_FLAGS.build(params)
    try:
        row = _run_with_session(settings.database_url, lambda session: revoke_key(session, key_id))
    except NotFound as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"revoked key {row.id} of project {row.project!r}")
