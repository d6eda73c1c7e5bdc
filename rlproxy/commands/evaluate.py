"""`rlproxy eval`: a policy measured with the evidence the gates use."""
from __future__ import annotations

import asyncio

import click
from sqlalchemy.exc import SQLAlchemyError

from core.settings import DEFAULT_PROXY, EvalSettings
from rlproxy.commands.flags import Flags
from rlproxy.commands.options import redact
from rlproxy.extras import require

EVAL_FLAGS = Flags(EvalSettings)


@click.command("eval")
@EVAL_FLAGS
def eval_(**params) -> None:
    """Measure a policy with the evidence the gates use, saying which set each number is from: your
    --command, the --traffic it served, or the demo task's held-out split. See docs/gates.md."""
    given = EVAL_FLAGS.given(params)
    settings = EVAL_FLAGS.build(params)
    proxy, upstream = settings.proxy, settings.upstream
    if proxy and upstream:
        if ("proxy" in given) == ("upstream" in given):  # both flags, or both variables
            raise click.UsageError("give --proxy or --upstream, not both")
        proxy, upstream = (proxy, None) if "proxy" in given else (None, upstream)  # the flag wins
    if settings.traffic and settings.eval_command:
        raise click.UsageError("give --command or --traffic, not both")
    # The gates' evaluation is the trainer's: not imported by the proxy's commands.
    from trainer.gates import evaluate

    proxy = None if upstream else (proxy or DEFAULT_PROXY)
    version, database_url = settings.version, settings.database_url
    try:
        if settings.traffic:
            for line in asyncio.run(evaluate.by_traffic(version, database_url)):
                click.echo(line)
            return
        if settings.eval_command:
            result, stored = asyncio.run(evaluate.by_command(
                version, settings.eval_command, settings.split, database_url, proxy=proxy, upstream=upstream,
                api_key=settings.key(), timeout=settings.eval_timeout))
            click.echo(f"{result.describe()} ({result.model}, {result.seconds:.0f} s)")
        else:
            require("eval (the demo task's held-out set)", "demo", ("openai",))
            from demo.evaluate import evaluate_policy  # the demo task's agent needs rlproxy[demo]'s openai

            result, stored = asyncio.run(evaluate_policy(
                version, database_url, proxy=proxy, upstream=upstream, tasks=settings.tasks, seed=settings.seed,
                concurrency=settings.concurrency, api_key=settings.key()))
            click.echo(f"v{version} ({result.model}) held-out success {result.describe()} on {result.tasks} tasks "
                       f"in {result.seconds:.0f} s")
    except evaluate.EvalError as exc:
        raise click.ClickException(str(exc)) from None
    except SQLAlchemyError as exc:
        raise click.ClickException(f"database {redact(database_url)}: {exc}") from None
    click.echo(f"stored on policy v{version}" if stored else "not stored: the base model (v0) has no policy row",
               err=True)
