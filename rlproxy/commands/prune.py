"""`rlproxy prune`: delete what is recorded past an age (store/retention.py says what may go)."""
from __future__ import annotations

import asyncio
from datetime import timedelta

import click

from core.settings.prune import PruneSettings
from rlproxy.commands.flags import Flags
from rlproxy.commands.options import redact
from store.db import short_session
from store.models import utcnow
from store.retention import prune as prune_all

PRUNE_FLAGS = Flags(PruneSettings)
MIN_AGE_S = 60


@click.command()
@PRUNE_FLAGS
def prune(**params) -> None:
    """Delete recorded data past an age: trained, expired and finished evaluation rollouts, and calls outside
    any rollout. Open rollouts and untrained training rollouts are never touched. Runs in small transactions
    beside a serving proxy."""
    settings = PRUNE_FLAGS.build(params)
    pruning = settings.pruning
    if pruning.older_than < MIN_AGE_S:  # "--older-than 30" meant as days is 30 seconds: nearly everything done
        raise click.UsageError(f"--older-than {pruning.older_than:g} seconds would delete nearly every rollout "
                               f"that is done with; give an age of at least a minute, with its unit (30d, 12h, 90m)")
    cutoff = utcnow() - timedelta(seconds=pruning.older_than)

    async def run():
        async with short_session(settings.database_url) as sessions:
            return await prune_all(sessions, cutoff, what=pruning.what,
                                   keep_trained_ids=pruning.keep_trained_ids, batch=settings.batch)

    done = asyncio.run(run())
    click.echo(f"pruned {redact(settings.database_url)} (created before {cutoff:%Y-%m-%d %H:%M:%S} UTC): "
               f"{done.rollouts} rollouts and {done.calls} calls deleted, {done.bodies} calls' bodies cleared")
