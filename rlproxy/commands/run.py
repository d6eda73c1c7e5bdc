"""`rlproxy run`: an agent driven over a task set through a running proxy (runner/, docs/run.md)."""
from __future__ import annotations

import asyncio
import sys

import click
from rich.console import Console

from core.settings import RunSettings
from rlproxy.commands.flags import Flags
from runner import confine
from runner.environment import hide_own_environment
from runner.errors import InfrastructureError, ProxyRefused, RunInputError
from runner.identity import agent_user, refuse_readable
from runner.harnesses import HARNESSES
from runner.leftovers import no_process_outlives_the_run
from runner.progress import summary
from runner.run import prepare, run_plan

RUN_FLAGS = Flags(RunSettings)
BAD_INPUT = 2  # as click's usage errors


def _fail(message: str, code: int) -> None:
    click.echo(f"rlproxy run: {message}", err=True)
    sys.exit(code)


def harness_choices(command: click.Command) -> click.Command:
    """--harness takes the names of runner/harnesses/'s registry (the settings model, below the runner, cannot
    name them)."""
    for option in command.params:
        if option.name == "harness":
            option.type = click.Choice(list(HARNESSES))
    return command


@harness_choices
@click.command("run")
@RUN_FLAGS
def run(**params) -> None:
    """Run an agent over a task set: each attempt is one rollout of the proxy, rewarded by the agent (or by what
    it returns), in groups of --attempts per task, resumable with --resume. See docs/run.md."""
    settings = RUN_FLAGS.build(params)
    hide_own_environment()  # before any agent starts: they run as this user
    confine.forget_own_environment()  # /proc/<runner>/environ blank: an agent run as root reads it otherwise
    confine.protect(RUN_FLAGS.secret_files(params).values())  # the key files: out of the confined agents' reach
    try:
        plan = prepare(settings)
        user = agent_user(settings.agent_user)
        if user is not None:  # a key file the agents' user could read would hand them the runner's key
            refuse_readable(user, RUN_FLAGS.secret_files(params))
    except RunInputError as exc:
        _fail(str(exc), BAD_INPUT)
    try:
        with no_process_outlives_the_run():
            outcomes = asyncio.run(run_plan(plan))
    except RunInputError as exc:
        _fail(str(exc), BAD_INPUT)
    except ProxyRefused as exc:
        _fail(str(exc), 1)
    except InfrastructureError as exc:  # the proxy went away outside any attempt (resuming, pacing)
        _fail(f"{exc}; `--resume` goes on from {settings.log}", 1)
    except (KeyboardInterrupt, asyncio.CancelledError):  # Ctrl-C, or SIGTERM (runner/run.py)
        _fail(f"interrupted; `--resume` goes on from {settings.log}", 130)
    console = Console()
    console.print(summary(outcomes, settings.success_threshold))
    console.print(f"each attempt in the web view: {settings.proxy.rstrip('/')}/ui/#/rollouts", soft_wrap=True)
