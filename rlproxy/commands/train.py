"""`rlproxy train` (the trainer worker), `rlproxy train-config` and `rlproxy export`."""
from __future__ import annotations

import asyncio
import errno
import os
import sys
from pathlib import Path

import click
from prometheus_client import start_http_server
from sqlalchemy.exc import SQLAlchemyError

from core.settings import TrainerSettings, TrainingSettings
from core.settings.maintenance import ExportSettings
from engine.model import default_model_path
from migrations.apply import schema_problem
from rlproxy.commands.flags import Flags
from rlproxy.commands.options import redact
from rlproxy.extras import require

TRAIN_FLAGS = Flags(TrainerSettings)


@click.command()
@TRAIN_FLAGS
@click.option("--set", "pairs", multiple=True, metavar="NAME=VALUE",
              help="Any setting above by its field name, e.g. --set learning_rate=5e-4 (the same as "
                   "--learning-rate 5e-4; --set wins). `rlproxy train-config` lists the training settings.")
def train(pairs, **params) -> None:
    """Run the trainer worker: rewarded rollouts in, LoRA PPO, new adapters hot-loaded into the engines."""
    require("train", "train")
    settings = TRAIN_FLAGS.build(params, pairs)
    # The trainer needs torch (rlproxy[train]), which the proxy's image has not: imported by this command only.
    from trainer import parallel
    from trainer.judge import usage_problem

    if not settings.upstreams:
        raise click.UsageError("--upstream is required: the engine(s) to load adapters into")
    if problem := usage_problem(settings):  # at once, before torch loads
        raise click.UsageError(problem)
    if (settings.nproc_per_node > 1 or settings.training.offload_base) and not parallel.launched_by_torchrun():
        _exec_torchrun(settings.nproc_per_node)
    model_path = settings.model or default_model_path()  # prepares the bundled model when it is not yet
    collective = (parallel.init_from_environment(settings.collective_timeout_s, settings.heartbeat_dir)
                  if parallel.launched_by_torchrun() else None)
    if collective is not None and collective.rank != 0:  # a follower: no database, engines or metrics port
        from trainer.ppo import PolicyTrainer  # torch, as above

        def build(adapter_dir):
            return PolicyTrainer(model_path, settings.training, adapter_dir, collective)

        try:
            parallel.follow(build, collective)
        except KeyboardInterrupt:
            pass
        return
    _run_leader(settings, model_path, collective)


def _run_leader(settings: TrainerSettings, model_path: Path, collective) -> None:
    """The worker that talks to the database and the engines (the only one without torchrun)."""
    # The worker trains with torch (rlproxy[train]): imported by this command only, as above.
    from trainer.adapter import AdapterMismatch
    from trainer.gates import build_gate
    from trainer.gates.command import EvalCommandError, check_template
    from trainer.metrics import TrainerMetrics
    from trainer.teacher import TeacherRefused
    from trainer.worker import TrainerWorker

    _require_schema(settings.database_url)
    if settings.gate == "command":
        if not settings.eval_command:
            raise click.UsageError("--gate command needs --eval-command (or RLPROXY_EVAL_COMMAND)")
        try:
            check_template(settings.eval_command)
        except EvalCommandError as exc:
            raise click.BadParameter(str(exc), param_hint="--eval-command") from None
    if settings.metrics_port:
        worker_metrics = TrainerMetrics()
        try:
            start_http_server(settings.metrics_port, registry=worker_metrics.registry)
        except OSError as exc:
            taken = ("is another trainer running there? One trainer per database (docs/deploy.md: scale it up, not "
                     "out); " if exc.errno == errno.EADDRINUSE else "")
            raise click.ClickException(f"cannot serve the trainer's metrics on port {settings.metrics_port} "
                                       f"({exc.strerror}): {taken}give --metrics-port another port, or 0 for none"
                                       ) from None
    else:
        worker_metrics = None
    worker = TrainerWorker(settings, model_path, metrics=worker_metrics,
                           on_published=build_gate(settings, metrics=worker_metrics), collective=collective)
    try:
        asyncio.run(worker.run())
    except KeyboardInterrupt:
        pass
    except (AdapterMismatch, TeacherRefused) as exc:
        raise click.ClickException(str(exc)) from None


def _require_schema(database_url: str) -> None:
    """Refuse, in one line, a database whose schema is not this rlproxy's; one that does not answer now is left to
    the worker, which waits for it as it always has."""
    try:
        problem = asyncio.run(schema_problem(database_url))
    except (SQLAlchemyError, OSError):
        return
    if problem is not None:
        raise click.ClickException(f"the database {redact(database_url)} {problem}")


def _exec_torchrun(nproc_per_node: int) -> None:
    """Replace this process with torchrun running the same `rlproxy train` command once per rank."""
    args, skip = [], False
    for arg in sys.argv[1:]:
        if skip:
            skip = False
        elif arg == "--nproc-per-node":
            skip = True
        elif not arg.startswith("--nproc-per-node="):
            args.append(arg)
    os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", "--standalone",
                              f"--nproc-per-node={nproc_per_node}", "-m", "rlproxy.cli", *args])


def training_from(pairs: list[str] | tuple[str, ...]) -> TrainingSettings:
    """The training settings NAME=VALUE pairs (`--set`'s form) give, each parsed as its flag parses it, over the
    defaults (no environment variable is read)."""
    return TrainerSettings(**TRAIN_FLAGS.pairs(pairs)).training


@click.command("train-config")
def train_config() -> None:
    """List every training setting with its default, flag, environment variable and meaning."""
    for setting in TRAIN_FLAGS.settings:
        if setting.path[0] == "training":
            click.echo(f"{setting.name} = {setting.default!r}  (--{setting.flag}, {setting.env})\n"
                       f"    {setting.help}")


EXPORT_FLAGS = Flags(ExportSettings)


@click.command()
@EXPORT_FLAGS
def export(**params) -> None:
    """Write training transitions (ids, text, reward, advantage, policy) as JSON lines."""
    settings = EXPORT_FLAGS.build(params)
    from trainer.export import export_to_file  # the trainer's package: not imported by the proxy's commands

    count = export_to_file(settings.database_url, settings.out, include_trained=not settings.untrained_only)
    click.echo(f"wrote {count} transitions to {settings.out}")
