"""`rlproxy train` (the trainer worker), `rlproxy train-config` and `rlproxy export`."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from core.settings import TrainerSettings
from rlproxy.commands.flags import Flags
from rlproxy.commands.options import database_option, option
from rlproxy.extras import require
from trainer.config import TrainConfig

TRAIN_FLAGS = Flags(TrainerSettings, TrainConfig)


@click.command()
@TRAIN_FLAGS
@click.option("--set", "overrides", multiple=True, metavar="NAME=VALUE",
              help="Any setting above by its field name, e.g. --set learning_rate=5e-4 (the same as "
                   "--learning-rate 5e-4; --set wins). `rlproxy train-config` lists the training settings.")
def train(overrides, **params) -> None:
    """Run the trainer worker: rewarded rollouts in, LoRA PPO, new adapters hot-loaded into the engines."""
    import asyncio

    require("train", "train")
    from trainer.judge import usage_problem

    TRAIN_FLAGS.apply_set(params, overrides)
    if not params.get("upstreams"):
        raise click.UsageError("--upstream is required: the engine(s) to load adapters into")
    if problem := usage_problem(TRAIN_FLAGS.build(TrainerSettings, dict(params))):  # at once, before torch loads
        raise click.UsageError(problem)
    from trainer import parallel
    from trainer.worker import TrainerWorker

    if (params["nproc_per_node"] > 1 or params["offload_base"]) and not parallel.launched_by_torchrun():
        _exec_torchrun(params["nproc_per_node"])
    if params["gate"] == "heldout":  # the bundled demo task's own configuration of the command gate
        from demo.score import command

        params.update(gate="command", eval_command=command(tasks=params["heldout_tasks"]))
    config = TRAIN_FLAGS.build(TrainConfig, params)
    settings = TRAIN_FLAGS.build(TrainerSettings, params)
    from engine.model import default_model_path  # prepares the bundled model when it is not yet

    collective = parallel.init_from_environment() if parallel.launched_by_torchrun() else None
    if collective is not None and collective.rank != 0:  # a follower: no database, engines or metrics port
        from trainer.ppo import PolicyTrainer

        def build(adapter_dir):
            return PolicyTrainer(settings.model or default_model_path(), config, adapter_dir, collective)

        try:
            parallel.follow(build, collective)
        except KeyboardInterrupt:
            pass
        return
    if settings.gate == "command":
        from trainer.gates.command import EvalCommandError, check_template

        if not settings.eval_command:
            raise click.UsageError("--gate command needs --eval-command (or RLPROXY_EVAL_COMMAND)")
        try:
            check_template(settings.eval_command)
        except EvalCommandError as exc:
            raise click.BadParameter(str(exc), param_hint="--eval-command") from None
    if settings.metrics_port:
        from prometheus_client import start_http_server

        worker_metrics = _trainer_metrics()
        start_http_server(settings.metrics_port, registry=worker_metrics.registry)
    else:
        worker_metrics = None
    from trainer.gates import build_gate

    worker = TrainerWorker(settings, config, settings.model or default_model_path(), metrics=worker_metrics,
                           on_published=build_gate(settings, eval_agents=config.eval_agents,
                                                   metrics=worker_metrics),
                           collective=collective)
    try:
        asyncio.run(worker.run())
    except KeyboardInterrupt:
        pass


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


def train_config_from(overrides: tuple[str, ...] | list[str]) -> TrainConfig:
    """A TrainConfig from NAME=VALUE strings (`--set`'s form), each parsed as its flag parses it."""
    params: dict = {}
    TRAIN_FLAGS.apply_set(params, overrides)
    return TRAIN_FLAGS.build(TrainConfig, params)


def _trainer_metrics():
    from trainer.metrics import TrainerMetrics

    return TrainerMetrics()


@click.command("train-config")
def train_config() -> None:
    """List every training setting with its default, flag, environment variable and meaning."""
    from rlproxy.commands.flags import env_name

    for setting in TRAIN_FLAGS.settings[TrainConfig]:
        click.echo(f"{setting.path[-1]} = {setting.default!r}  (--{setting.flag}, {env_name(setting.flag)})\n"
                   f"    {setting.help}")


@click.command()
@database_option()
@option("--out", required=True, type=click.Path(path_type=Path), help="JSON-lines file to write.")
@option("--untrained-only", is_flag=True, help="Only rollouts the trainer has not consumed yet.")
def export(database_url: str, out: Path, untrained_only: bool) -> None:
    """Write training transitions (ids, text, reward, advantage, policy) as JSON lines."""
    from trainer.export import export_to_file

    count = export_to_file(database_url, out, include_trained=not untrained_only)
    click.echo(f"wrote {count} transitions to {out}")
