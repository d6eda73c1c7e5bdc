"""The `rlproxy` command. Every flag also reads `RLPROXY_<FLAG>` from the environment."""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import click

from rlproxy.settings import DEFAULT_DATABASE_URL, ProxySettings, WriterSettings


def env(name: str) -> str:
    return "RLPROXY_" + name.upper().replace("-", "_")


def option(*names: str, **kwargs):
    """A click option whose environment variable is `RLPROXY_<LONG FLAG>`."""
    long = next(n for n in names if n.startswith("--")).lstrip("-").split("/")[0]
    return click.option(*names, envvar=env(long), show_envvar=True, show_default=True, **kwargs)


def database_option():
    return option("--database-url", default=DEFAULT_DATABASE_URL, help="SQLAlchemy async database URL.")


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
def serve(host, port, upstreams, database_url, served_model, migrate, client_max_size, upstream_timeout,
          spool_path) -> None:
    """Run the proxy."""
    from proxy.app import run

    settings = ProxySettings(
        host=host, port=port, upstreams=tuple(u for value in upstreams for u in value.split(",") if u),
        database_url=database_url, served_model=served_model, migrate=migrate, client_max_size=client_max_size,
        upstream_timeout=upstream_timeout, writer=WriterSettings(spool_path=spool_path),
    )
    if settings.upstreams:
        run(settings)
        return
    from rlproxy.engine import Engine
    from rlproxy.settings import EngineSettings

    with Engine(EngineSettings()) as engine:
        run(settings.model_copy(update={"upstreams": (engine.base_url,)}))


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
def train(database_url, upstreams, model_path, adapters_dir, worker_id, metrics_port, max_steps, poll_interval,
          lease_seconds, overrides) -> None:
    """Run the trainer worker: rewarded rollouts in, LoRA PPO, new adapters hot-loaded into the engines."""
    import asyncio

    from rlproxy.settings import TrainerSettings
    from trainer.worker import TrainerWorker

    config = train_config_from(overrides)
    settings = TrainerSettings(database_url=database_url, upstreams=tuple(upstreams), model=model_path,
                               adapters_dir=adapters_dir, worker_id=worker_id,
                               metrics_port=metrics_port or None, max_steps=max_steps,
                               poll_interval=poll_interval, lease_seconds=lease_seconds)
    if settings.metrics_port:
        from prometheus_client import start_http_server

        worker_metrics = _trainer_metrics()
        start_http_server(settings.metrics_port, registry=worker_metrics.registry)
    else:
        worker_metrics = None
    from rlproxy.model import default_model_path

    worker = TrainerWorker(settings, config, model_path or default_model_path(), metrics=worker_metrics)
    try:
        asyncio.run(worker.run())
    except KeyboardInterrupt:
        pass


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


@main.command()
@option("--minutes", default=15.0, type=float, help="How long to train.")
@database_option()
@option("--workdir", default=".", type=click.Path(path_type=Path, file_okay=False),
        help="Where adapters, the demo state and the reward curve go.")
@option("--engine-port", default=8000, type=int, help="Port of the local vLLM engine.")
@option("--port", default=8400, type=int, help="Port of the proxy.")
@option("--concurrency", default=8, type=int, help="Agent episodes in flight.")
@option("--heldout", default=48, type=int, help="Held-out tasks per evaluation.")
@option("--air/--no-air", default=True, help="Automatic intermediate rewards.")
@option("--headless", is_flag=True, help="No live panel (logs only).")
@option("--upstream", default=None, help="Use this running engine (base URL, runtime LoRA on) instead of starting one.")
@option("--set", "overrides", multiple=True, metavar="FIELD=VALUE", help="Any training setting.")
def demo(minutes, database_url, workdir, engine_port, port, concurrency, heldout, air, headless, upstream,
         overrides) -> None:
    """The whole loop on the embedded default: engine + proxy + trainer + a tool-using agent, learning live."""
    import asyncio

    from demo.run import Demo, DemoSettings
    from demo.view import reward_curve, summary

    workdir.mkdir(parents=True, exist_ok=True)
    base = {"batch_rollouts": "16", "group_size": "4", "group_timeout_s": "60"}
    base.update(dict(item.partition("=")[::2] for item in overrides))
    settings = DemoSettings(minutes=minutes, database_url=database_url, workdir=workdir, engine_port=engine_port,
                            proxy_port=port, concurrency=concurrency, heldout=heldout, air=air, headless=headless,
                            upstream=upstream,
                            train=train_config_from([f"{k}={v}" for k, v in base.items()]))
    progress = asyncio.run(Demo(settings).run())
    summary(progress, settings)
    curve = reward_curve(progress, _database_dir(database_url, workdir) / "rlproxy-reward-curve.png")
    if curve:
        click.echo(f"reward curve: {curve}")


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


if __name__ == "__main__":
    main()
