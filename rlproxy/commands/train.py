"""`rlproxy train` (the trainer worker), `rlproxy train-config` and `rlproxy export`."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from rlproxy.commands.options import database_option, option


@click.command()
@database_option()
@option("--upstream", "upstreams", multiple=True, required=True,
        help="Engine base URL (no /v1) to load adapters into; repeat for every replica.")
@option("--model", "model_path", default=None, type=click.Path(path_type=Path),
        help="Base model folder the engines serve (default: the prepared bundled model).")
@option("--adapters-dir", default="rlproxy-adapters", type=click.Path(path_type=Path),
        help="Where adapter versions are written (must be readable by the engines).")
@option("--worker-id", default="trainer", help="Lease owner name; unique per trainer.")
@option("--metrics-port", default=8401, type=int, help="Prometheus metrics port (0: off).")
@option("--max-steps", default=None, type=int, help="Stop after this many steps.")
@option("--poll-interval", default=1.0, type=float, help="Seconds between looks for ready rollouts.")
@option("--lease-seconds", default=900.0, type=float,
        help="How long claimed rollouts stay reserved for one step (a restart of the same --worker-id takes "
             "its own leases back at once).")
@option("--set", "overrides", multiple=True, metavar="FIELD=VALUE",
        help="Any training setting, e.g. --set learning_rate=5e-5 --set group_size=8 (see `rlproxy train-config`).")
@option("--gate", default="none", type=click.Choice(["none", "canary", "eval-traffic", "command", "heldout"]),
        help="What a new adapter must pass before it serves (docs/gates.md): none; canary (a share of new "
             "rollouts vs the active policy); eval-traffic (a share of new evaluation rollouts vs the active "
             "policy); command (your --eval-command scores it vs its parent); heldout (the bundled demo task's "
             "command: `python -m demo.score` on its gate split).")
@option("--gate-margin", default=0.1, type=click.FloatRange(min=0),
        help="How much worse than the policy it would replace a candidate may score and still be promoted.")
@option("--eval-command", default=None, metavar="COMMAND",
        help="Your evaluation script for --gate command, e.g. \"python my_eval.py --base-url {base_url} --model "
             "{model}\"; it prints one JSON line {\"score\": x, \"n\": k}. Placeholders: {base_url} {model} "
             "{version} {split}.")
@option("--eval-timeout", default=1800.0, type=click.FloatRange(min=0, min_open=True),
        help="Seconds one run of --eval-command may take; then it is killed and the candidate not promoted.")
@option("--eval-base-url", default=None,
        help="Base URL (ending in /v1) given to --eval-command (default: the first --upstream's).")
@option("--eval-fraction", default=0.5, type=click.FloatRange(0, 1, min_open=True, max_open=True),
        help="Share of new evaluation rollouts a candidate answers (--gate eval-traffic).")
@option("--heldout-tasks", default=48, type=click.IntRange(min=1),
        help="Tasks per evaluation of --gate heldout (the demo task's gate split).")
@option("--canary-fraction", default=0.1, type=click.FloatRange(0, 1, min_open=True, max_open=True),
        help="Share of new rollouts the canary answers (--gate canary).")
@option("--canary-min-rollouts", default=50, type=click.IntRange(min=1),
        help="Finished rollouts the canary and the active policy each need before the judge decides.")
@option("--upstream-api-key", default=None, help="Bearer key sent to the engines (vLLM --api-key).")
@option("--nproc-per-node", default=1, type=click.IntRange(min=1),
        help="Data-parallel training processes on this machine (one per GPU; on a CPU they share its cores). "
             "Starts torchrun; for several machines run torchrun yourself (see trainer/parallel.py).")
@option("--eval-agents", "eval_agents", multiple=True, metavar="NAME",
        help="Agents whose rollouts are evaluation traffic: never trained on, their final rewards reported per "
             "policy version in GET /policies (repeat, or separate with commas; same as --set eval_agents=...).")
def train(database_url, upstreams, model_path, adapters_dir, worker_id, metrics_port, max_steps, poll_interval,
          lease_seconds, overrides, gate, gate_margin, eval_command, eval_timeout, eval_base_url, eval_fraction,
          heldout_tasks, canary_fraction, canary_min_rollouts, upstream_api_key, nproc_per_node, eval_agents) -> None:
    """Run the trainer worker: rewarded rollouts in, LoRA PPO, new adapters hot-loaded into the engines."""
    import asyncio

    from rlproxy.settings import TrainerSettings
    from trainer import parallel
    from trainer.worker import TrainerWorker

    if nproc_per_node > 1 and not parallel.launched_by_torchrun():
        _exec_torchrun(nproc_per_node)
    config = train_config_from(overrides)
    named = [name.strip() for value in eval_agents for name in value.split(",") if name.strip()]
    if named:
        from dataclasses import replace

        config = replace(config, eval_agents=list(dict.fromkeys(config.eval_agents + named)))
    collective = parallel.init_from_environment() if parallel.launched_by_torchrun() else None
    if collective is not None and collective.rank != 0:  # a follower: no database, engines or metrics port
        from rlproxy.model import default_model_path
        from trainer.ppo import PolicyTrainer

        def build(adapter_dir):
            return PolicyTrainer(model_path or default_model_path(), config, adapter_dir, collective)

        try:
            parallel.follow(build, collective)
        except KeyboardInterrupt:
            pass
        return
    if gate == "heldout":  # the bundled demo task's own configuration of the command gate
        from demo.score import command

        gate, eval_command = "command", command(tasks=heldout_tasks)
    if gate == "command":
        from trainer.gates.command import EvalCommandError, check_template

        if not eval_command:
            raise click.UsageError("--gate command needs --eval-command (or RLPROXY_EVAL_COMMAND)")
        try:
            check_template(eval_command)
        except EvalCommandError as exc:
            raise click.BadParameter(str(exc), param_hint="--eval-command") from None
    settings = TrainerSettings(database_url=database_url, upstreams=tuple(upstreams), model=model_path,
                               adapters_dir=adapters_dir, worker_id=worker_id,
                               metrics_port=metrics_port or None, max_steps=max_steps,
                               poll_interval=poll_interval, lease_seconds=lease_seconds, gate=gate,
                               gate_margin=gate_margin, eval_command=eval_command, eval_timeout=eval_timeout,
                               eval_base_url=eval_base_url, eval_fraction=eval_fraction,
                               canary_fraction=canary_fraction, canary_min_rollouts=canary_min_rollouts,
                               upstream_api_key=upstream_api_key)
    if settings.metrics_port:
        from prometheus_client import start_http_server

        worker_metrics = _trainer_metrics()
        start_http_server(settings.metrics_port, registry=worker_metrics.registry)
    else:
        worker_metrics = None
    from rlproxy.model import default_model_path
    from trainer.gates import build_gate

    worker = TrainerWorker(settings, config, model_path or default_model_path(), metrics=worker_metrics,
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


def train_config_from(overrides: tuple[str, ...] | list[str]):
    """A TrainConfig from FIELD=VALUE strings, each value read as the field's type (lists comma-separated)."""
    from dataclasses import fields

    from trainer.config import TrainConfig

    kinds = {f.name: f.default_factory() if callable(f.default_factory) else f.default
             for f in fields(TrainConfig)}
    values = {}
    for item in overrides:
        name, sep, raw = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in kinds:
            raise click.BadParameter(f"{item!r}: expected FIELD=VALUE with FIELD one of {', '.join(kinds)}")
        default = kinds[name]
        if isinstance(default, bool):
            values[name] = raw.strip().lower() in ("1", "true", "yes", "on")
        elif isinstance(default, list):
            values[name] = [part.strip() for part in raw.split(",") if part.strip()]
        elif default is None or isinstance(default, str):
            values[name] = raw
        else:
            values[name] = type(default)(raw)
    try:
        return TrainConfig(**values)
    except (TypeError, ValueError) as exc:
        raise click.BadParameter(str(exc)) from None


def _trainer_metrics():
    from trainer.metrics import TrainerMetrics

    return TrainerMetrics()


@click.command("train-config")
def train_config() -> None:
    """List every training setting with its default and meaning."""
    from dataclasses import fields

    from trainer.config import TrainConfig

    defaults = TrainConfig()
    for f in fields(TrainConfig):
        click.echo(f"{f.name} = {getattr(defaults, f.name)!r}\n    {f.metadata.get('help', '')}")


@click.command()
@database_option()
@option("--out", required=True, type=click.Path(path_type=Path), help="JSON-lines file to write.")
@option("--untrained-only", is_flag=True, help="Only rollouts the trainer has not consumed yet.")
def export(database_url: str, out: Path, untrained_only: bool) -> None:
    """Write training transitions (ids, text, reward, advantage, policy) as JSON lines."""
    from trainer.export import export_to_file

    count = export_to_file(database_url, out, include_trained=not untrained_only)
    click.echo(f"wrote {count} transitions to {out}")
