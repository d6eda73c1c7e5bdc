"""The `rlproxy` command. Every flag also reads `RLPROXY_<FLAG>` from the environment."""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import click

from rlproxy.settings import DEFAULT_DATABASE_URL, AuthSettings, ProxySettings, WriterSettings


def env(name: str) -> str:
    return "RLPROXY_" + name.upper().replace("-", "_")


def option(*names: str, **kwargs):
    """A click option whose environment variable is `RLPROXY_<LONG FLAG>`."""
    long = next(n for n in names if n.startswith("--")).lstrip("-").split("/")[0]
    return click.option(*names, envvar=env(long), show_envvar=True, show_default=True, **kwargs)


def database_option():
    return option("--database-url", default=DEFAULT_DATABASE_URL, help="SQLAlchemy async database URL.")


def auth_options(command):
    """`serve`'s access flags; they arrive as keyword arguments named like AuthSettings' fields."""
    flags = [
        option("--auth", "mode", type=click.Choice(["auto", "on", "off"]), default="auto",
               help="Require API keys. auto: when any key exists; a non-loopback --host without keys is "
                    "refused unless --auth off."),
        option("--admin-key", default=None,
               help="Operator key with admin rights over every project (policy activation, metrics)."),
        option("--key-cache-ttl", default=30.0, type=float,
               help="Seconds key lookups are cached (a revoked key may work this long)."),
        option("--rate-limit", default=None, type=float,
               help="Requests per second per key (default: unlimited)."),
        option("--rate-burst", default=None, type=int,
               help="Requests a key may send at once (default: the rate)."),
        option("--max-tokens", default=None, type=int, help="Largest max_tokens a request may ask for."),
        option("--max-n", default=None, type=int, help="Largest n (completions per request) accepted."),
        option("--redact-content/--no-redact-content", default=False,
               help="Store message and completion text as a marker (token ids are kept)."),
        option("--upstream-api-key", default=None,
               help="Bearer key the proxy sends to the engines (agents' keys are never passed on)."),
    ]
    for flag in reversed(flags):
        command = flag(command)
    return command


def _logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    for chatty in ("httpx", "httpx2", "openai", "aiohttp.access"):  # one line per HTTP request otherwise
        logging.getLogger(chatty).setLevel(logging.DEBUG if verbose else logging.WARNING)


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def main(verbose: bool) -> None:
    """rlproxy: an OpenAI-compatible proxy that records every policy call and trains what it serves."""
    _logging(verbose)
    # Before torch loads: spinning OpenMP threads made a training step 3-6x slower next to the engine on
    # shared cores; passive waiting gives the cores back.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@main.command()
@option("--host", default="127.0.0.1", help="Interface to listen on.")
@option("--port", default=8400, type=int, help="Port to listen on.")
@option("--upstream", "upstreams", multiple=True,
        help="OpenAI-compatible engine base URL without /v1; repeat for replicas. Default: start a local engine.")
@database_option()
@option("--served-model", default=None, help="Model name agents ask for (default: the engine's base model).")
@option("--migrate/--no-migrate", default=True, help="Apply database migrations on start.")
@option("--client-max-size", default=64 * 1024 * 1024, type=int, help="Largest request body, bytes.")
@option("--upstream-timeout", default=600.0, type=float, help="Seconds an upstream request may take.")
@option("--spool-path", default="rlproxy-spool.jsonl", type=click.Path(path_type=Path),
        help="Where calls wait when the database is unavailable.")
@option("--durability", default="batch", type=click.Choice(["batch", "sync"]),
        help="batch: answer, then record; sync: every call is fsynced to the spool before it is answered.")
@option("--shutdown-timeout", default=30.0, type=float,
        help="Seconds in-flight requests and streams may take to finish after SIGTERM.")
@option("--air-text-action", default=None, metavar="REGEX",
        help="AIR for agents with a text tool protocol (docs/air.md): a reply in which this regex is "
             "found is a tool call, e.g. 'CALC:'. Needs --air-text-error and/or --air-text-success. Default: off.")
@option("--air-text-error", default=None, metavar="REGEX",
        help="The user/tool turn answering a text tool call is a tool_error when this regex matches at its "
             "start, e.g. 'ERROR:'.")
@option("--air-text-success", default=None, metavar="REGEX",
        help="... and a tool_success when this one does (weight: --air-tool-success).")
@option("--air-tool-success", default=0.0, type=float,
        help="AIR weight of tool_success, native and text tool calls (0: not emitted).")
@auth_options
def serve(host, port, upstreams, database_url, served_model, migrate, client_max_size, upstream_timeout,
          spool_path, durability, shutdown_timeout, air_text_action, air_text_error, air_text_success,
          air_tool_success, **auth) -> None:
    """Run the proxy."""
    from proxy.air import air_rules
    from proxy.app import run

    settings = ProxySettings(
        host=host, port=port, upstreams=tuple(u for value in upstreams for u in value.split(",") if u),
        database_url=database_url, served_model=served_model, migrate=migrate, client_max_size=client_max_size,
        upstream_timeout=upstream_timeout, shutdown_timeout=shutdown_timeout,
        air_text_action=air_text_action, air_text_error=air_text_error, air_text_success=air_text_success,
        air_tool_success=air_tool_success,
        writer=WriterSettings(spool_path=spool_path, durability=durability),
        auth=AuthSettings(**auth),
    )
    try:
        air_rules(settings)
    except ValueError as exc:
        raise click.UsageError(f"--air-text-*: {exc}") from None
    _refuse_open_network(settings)
    if settings.upstreams:
        run(settings)
        return
    from rlproxy.engine import Engine
    from rlproxy.settings import EngineSettings

    with Engine(EngineSettings()) as engine:
        run(settings.model_copy(update={"upstreams": (engine.base_url,)}))


def _refuse_open_network(settings: ProxySettings) -> None:
    """Fail at once, before an engine starts, rather than serve a non-loopback host without keys (the server
    checks again at startup, after migrating; this is the early, readable exit)."""
    import asyncio

    from sqlalchemy.exc import SQLAlchemyError

    from proxy.auth import AuthConfigError, is_loopback, resolve_auth
    from store.db import create_engine, session_factory

    if settings.auth.mode != "auto" or is_loopback(settings.host):
        return

    async def check() -> None:
        engine = create_engine(settings.database_url)
        try:
            await resolve_auth(settings.auth, settings.host, session_factory(engine))
        finally:
            await engine.dispose()

    try:
        asyncio.run(check())
    except AuthConfigError as exc:
        raise click.ClickException(str(exc)) from None
    except (SQLAlchemyError, OSError):
        pass  # the database is not reachable now: the server says so when it starts


@main.command()
@database_option()
def migrate(database_url: str) -> None:
    """Upgrade the database to the newest schema."""
    from store.migrate import upgrade

    upgrade(database_url)
    click.echo(f"database at newest schema: {_redact(database_url)}")


@main.group()
def model() -> None:
    """The bundled model."""


@model.command("prepare")
@option("--out", default=None, type=click.Path(path_type=Path), help="Folder to write (default: the cache).")
def model_prepare(out: Path | None) -> None:
    """Turn the bundled SmolLM2-135M-Instruct GGUF into a Hugging Face folder (idempotent); print its path."""
    from rlproxy.model import prepare_model

    click.echo(str(prepare_model(out)))


@main.command()
@option("--model", "model_path", default=None, type=click.Path(path_type=Path),
        help="Hugging Face model folder (default: the prepared bundled model).")
@option("--host", default="127.0.0.1", help="Interface the engine listens on.")
@option("--port", default=8000, type=int, help="Port the engine listens on.")
@option("--served-model-name", default=None, help="Name the base model is served under.")
@option("--max-model-len", default=4096, type=int, help="Context length.")
@option("--kv-cache-gib", default=2, type=int, help="KV cache size on CPU, GiB.")
@option("--max-lora-rank", default=16, type=int, help="Largest LoRA rank accepted.")
@option("--max-loras", default=4, type=int, help="Adapters resident at once.")
def engine(model_path, host, port, served_model_name, max_model_len, kv_cache_gib, max_lora_rank, max_loras) -> None:
    """Start and supervise a local vLLM with runtime LoRA loading; stops cleanly on SIGTERM or Ctrl-C."""
    import signal
    import threading

    from rlproxy.engine import Engine
    from rlproxy.settings import EngineSettings

    settings = EngineSettings(model=model_path, host=host, port=port, served_model_name=served_model_name,
                              max_model_len=max_model_len, kv_cache_gib=kv_cache_gib, max_lora_rank=max_lora_rank,
                              max_loras=max_loras)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    with Engine(settings) as running:
        click.echo(f"engine ready at {running.base_url}/v1 serving {running.served_model_name!r}", err=True)
        try:
            while not stopped.wait(1.0):
                if not running.running:
                    raise click.ClickException(f"engine exited with code {running.returncode}")
        except KeyboardInterrupt:
            pass


@main.command()
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


@main.command("train-config")
def train_config() -> None:
    """List every training setting with its default and meaning."""
    from dataclasses import fields

    from trainer.config import TrainConfig

    defaults = TrainConfig()
    for f in fields(TrainConfig):
        click.echo(f"{f.name} = {getattr(defaults, f.name)!r}\n    {f.metadata.get('help', '')}")


@main.command()
@database_option()
@option("--out", required=True, type=click.Path(path_type=Path), help="JSON-lines file to write.")
@option("--untrained-only", is_flag=True, help="Only rollouts the trainer has not consumed yet.")
def export(database_url: str, out: Path, untrained_only: bool) -> None:
    """Write training transitions (ids, text, reward, advantage, policy) as JSON lines."""
    from trainer.export import export_to_file

    count = export_to_file(database_url, out, include_trained=not untrained_only)
    click.echo(f"wrote {count} transitions to {out}")


def _policy_version(value) -> int:
    try:
        version = int(str(value).strip().lower().removeprefix("v"))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a version like v3") from None
    if version < 0:
        raise click.BadParameter("versions start at v0 (the base model)")
    return version


@main.command("eval")
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

    from rlproxy import evaluate

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
            from demo.evaluate import evaluate_policy

            result, stored = asyncio.run(evaluate_policy(
                version, database_url, proxy=proxy, upstream=upstream, tasks=tasks, seed=seed,
                concurrency=concurrency, api_key=api_key))
            click.echo(f"v{version} ({result.model}) held-out success {result.describe()} on {result.tasks} tasks "
                       f"in {result.seconds:.0f} s")
    except evaluate.EvalError as exc:
        raise click.ClickException(str(exc)) from None
    except SQLAlchemyError as exc:
        raise click.ClickException(f"database {_redact(database_url)}: {exc}") from None
    click.echo(f"stored on policy v{version}" if stored else "not stored: the base model (v0) has no policy row",
               err=True)


@main.command()
@option("--minutes", default=15.0, type=float, help="How long to train.")
@database_option()
@option("--workdir", default=".", type=click.Path(path_type=Path, file_okay=False),
        help="Where adapters, the demo state and the reward curve go.")
@option("--engine-port", default=8000, type=int, help="Port of the local vLLM engine.")
@option("--port", default=8400, type=int, help="Port of the proxy.")
@option("--concurrency", default=8, type=int, help="Agent episodes in flight.")
@option("--heldout", default=48, type=int, help="Held-out tasks per full evaluation (the base model; gate heldout).")
@option("--gate", default="probes", type=click.Choice(["probes", "heldout"]),
        help="probes: new versions serve at once and a share of episodes are held-out probes that measure them; "
             "heldout: every candidate is evaluated on the held-out set before it may serve.")
@option("--probe-share", default=0.25, type=click.FloatRange(0.0, 0.9), help="Share of episodes that are held-out probes.")
@option("--air/--no-air", default=True, help="Automatic intermediate rewards.")
@option("--headless", is_flag=True,
        help="No live panel: a progress line every ~30 s and one per new version (also without a terminal).")
@option("--upstream", default=None, help="Use this running engine (base URL, runtime LoRA on) instead of starting one.")
@option("--set", "overrides", multiple=True, metavar="FIELD=VALUE", help="Any training setting.")
def demo(minutes, database_url, workdir, engine_port, port, concurrency, heldout, gate, probe_share, air, headless,
         upstream, overrides) -> None:
    """The whole loop on the embedded default: engine + proxy + trainer + a tool-using agent, learning live.
    The engine's output goes to engine.log and every log to rlproxy.log, in --workdir."""
    from demo.main import run_demo

    workdir.mkdir(parents=True, exist_ok=True)
    # the demo's own training defaults, with what --set changes
    typed = train_config_from(overrides)
    changed = {item.partition("=")[0].strip().replace("-", "_") for item in overrides}
    options = dict(minutes=minutes, database_url=database_url, workdir=workdir, engine_port=engine_port,
                   proxy_port=port, concurrency=concurrency, heldout=heldout, gate=gate, probe_share=probe_share,
                   air=air, headless=headless, upstream=upstream)
    sys.exit(run_demo(options, {name: getattr(typed, name) for name in changed},
                      _database_dir(database_url, workdir)))


def _database_dir(database_url: str, fallback: Path) -> Path:
    """The folder of a SQLite database file (the curve goes next to it), else `fallback`."""
    from sqlalchemy.engine import make_url

    url = make_url(database_url)
    if url.get_backend_name() == "sqlite" and url.database:
        return Path(url.database).resolve().parent
    return fallback


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


@main.group()
def keys() -> None:
    """API keys: each belongs to a project; admin keys may also activate policies and read metrics."""


def _run_with_session(database_url: str, work):
    """Migrate, then run `work(session)` in one transaction and return its result."""
    import asyncio

    from store.db import create_engine, session_factory
    from store.migrate import upgrade

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
@option("--admin", is_flag=True, help="Also allow admin routes (policy activation, metrics).")
@option("--label", default=None, help="A note shown by `keys list`.")
@option("--rate-limit", default=None, type=float,
        help="Requests per second for this key (default: the server's).")
@option("--rate-burst", default=None, type=int, help="Burst for this key (default: the server's).")
@database_option()
def keys_create(project, admin, label, rate_limit, rate_burst, database_url) -> None:
    """Create a key and print it once (only its SHA-256 is stored)."""
    from store.keys import create_key

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
    from store.keys import list_keys

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
    from store.errors import NotFound
    from store.keys import revoke_key

    try:
        row = _run_with_session(database_url, lambda session: revoke_key(session, key_id))
    except NotFound as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"revoked key {row.id} of project {row.project!r}")


if __name__ == "__main__":
    main()
