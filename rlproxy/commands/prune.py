"""`rlproxy prune`: delete what is recorded past an age (store/retention.py says what may go)."""
from __future__ import annotations

import asyncio
import re
from datetime import timedelta

import click

from rlproxy.commands.options import database_option, option, redact
from store.db import create_engine, session_factory
from store.models import utcnow
from store.retention import prune as prune_all

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def seconds(value: str | float) -> float:
    """'30d', '12h', '90m', '45s', '2w' or a number of seconds."""
    text = str(value).strip().lower()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhdw]?)", text)
    if not match:
        raise click.BadParameter(f"{value!r}: expected a duration like 30d, 12h, 90m or a number of seconds")
    return float(match.group(1)) * UNITS[match.group(2) or "s"]


@click.command()
@database_option()
@option("--older-than", required=True, help="Age past which data goes, by the rollout's creation: 30d, 12h, 90m, "
                                            "or seconds.")
@option("--what", default="calls", type=click.Choice(["calls", "bodies"]),
        help="calls: delete whole rollouts (with their calls and rewards) and calls outside rollouts; bodies: "
             "keep every row, clear only request and response bodies (token ids, logprobs, rewards stay).")
@option("--keep-trained-ids", is_flag=True,
        help="With --what calls: trained rollouts keep their rows (ids, logprobs, rewards) and lose only their "
             "bodies, so `rlproxy export` still rebuilds what was trained on.")
@option("--batch", default=500, type=click.IntRange(min=1), help="Rollouts (and loose calls) per transaction.")
def prune(database_url: str, older_than: str, what: str, keep_trained_ids: bool, batch: int) -> None:
    """Delete recorded data past an age: trained, expired and finished evaluation rollouts, and calls outside
    any rollout. Open rollouts and untrained training rollouts are never touched. Runs in small transactions
    beside a serving proxy."""
    cutoff = utcnow() - timedelta(seconds=seconds(older_than))

    async def run():
        engine = create_engine(database_url)
        try:
            return await prune_all(session_factory(engine), cutoff, what=what, keep_trained_ids=keep_trained_ids,
                                   batch=batch)
        finally:
            await engine.dispose()

    done = asyncio.run(run())
    click.echo(f"pruned {redact(database_url)} (created before {cutoff:%Y-%m-%d %H:%M:%S} UTC): "
               f"{done.rollouts} rollouts and {done.calls} calls deleted, {done.bodies} calls' bodies cleared")
