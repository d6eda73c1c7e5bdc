"""`rlproxy eval`: a policy measured with the evidence the gates use."""
from __future__ import annotations

import click

from rlproxy.commands.options import database_option, option, redact
from rlproxy.extras import require


def _policy_version(value) -> int:
    try:
        version = int(str(value).strip().lower().removeprefix("v"))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a version like v3") from None
    if version < 0:
        raise click.BadParameter("versions start at v0 (the base model)")
    return version


@click.command("eval")
@option("--policy", "version", required=True, type=_policy_version, metavar="vN",
        help="The version to measure, e.g. v3 (v0: the base model).")
@option("--command", "eval_command", default=None, metavar="COMMAND",
        help="Your evaluation command (as for `train --eval-command`), run for this version; without it and "
             "without --traffic, the bundled demo task's held-out evaluation runs.")
@option("--split", default="heldout", type=click.Choice(["heldout", "gate"]),
        help="The {split} given to --command: heldout for a report; gate repeats what the gate decided on.")
@option("--traffic", is_flag=True, help="Report the evaluation traffic this version served (no engine needed).")
@option("--proxy", default=None,
        help="Evaluate through this running proxy (default http://127.0.0.1:8400 when --upstream is not given).")
@option("--upstream", default=None,
        help="Evaluate on this engine directly (base URL, no /v1), loading the adapter if it is not loaded.")
@option("--tasks", default=48, type=click.IntRange(min=1), help="Held-out tasks, one episode each (demo task).")
@option("--seed", default=0, type=int, help="Which held-out tasks (the same seed gives the same tasks).")
@option("--concurrency", default=8, type=click.IntRange(min=1), help="Episodes in flight (demo task).")
@option("--eval-timeout", default=1800.0, type=click.FloatRange(min=0, min_open=True),
        help="Seconds --command may take.")
@option("--api-key", default="rlproxy", help="Bearer key sent to the proxy (when its auth is on).")
@database_option()
def eval_(version, eval_command, split, traffic, proxy, upstream, tasks, seed, concurrency, eval_timeout, api_key,
          database_url) -> None:
    """Measure a policy with the evidence the gates use, saying which set each number is from: your
    --command, the --traffic it served, or the demo task's held-out split. See docs/gates.md."""
    import asyncio

    from sqlalchemy.exc import SQLAlchemyError

    from trainer.gates import evaluate

    if proxy and upstream:
        source = click.get_current_context().get_parameter_source
        from_env = click.core.ParameterSource.ENVIRONMENT
        if (source("proxy") == from_env) == (source("upstream") == from_env):
            raise click.UsageError("give --proxy or --upstream, not both")
        proxy, upstream = (None, upstream) if source("proxy") == from_env else (proxy, None)  # the flag wins
    if traffic and eval_command:
        raise click.UsageError("give --command or --traffic, not both")
    proxy = None if upstream else (proxy or evaluate.DEFAULT_PROXY)
    try:
        if traffic:
            for line in asyncio.run(evaluate.by_traffic(version, database_url)):
                click.echo(line)
            return
        if eval_command:
            result, stored = asyncio.run(evaluate.by_command(
                version, eval_command, split, database_url, proxy=proxy, upstream=upstream, api_key=api_key,
                timeout=eval_timeout))
            click.echo(f"{result.describe()} ({result.model}, {result.seconds:.0f} s)")
        else:
            require("eval (the demo task's held-out set)", "demo", ("openai",))
            from demo.evaluate import evaluate_policy

            result, stored = asyncio.run(evaluate_policy(
                version, database_url, proxy=proxy, upstream=upstream, tasks=tasks, seed=seed,
                concurrency=concurrency, api_key=api_key))
            click.echo(f"v{version} ({result.model}) held-out success {result.describe()} on {result.tasks} tasks "
                       f"in {result.seconds:.0f} s")
    except evaluate.EvalError as exc:
        raise click.ClickException(str(exc)) from None
    except SQLAlchemyError as exc:
        raise click.ClickException(f"database {redact(database_url)}: {exc}") from None
    click.echo(f"stored on policy v{version}" if stored else "not stored: the base model (v0) has no policy row",
               err=True)
