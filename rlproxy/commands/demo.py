"""`rlproxy demo`: the whole loop on the bundled model."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from demo.settings import DemoSettings, demo_training
from rlproxy.commands.flags import Flags
from rlproxy.extras import require
from trainer.config import TrainConfig

# The demo's training flags are the trainer's, with the demo's own defaults (demo/settings.py)
DEMO_FLAGS = Flags(DemoSettings, TrainConfig, skip=("train",), defaults={TrainConfig: demo_training()})


@click.command()
@DEMO_FLAGS
@click.option("--set", "overrides", multiple=True, metavar="NAME=VALUE",
              help="Any setting above by its field name, e.g. --set group_size=4 (--set wins).")
def demo(overrides, **params) -> None:
    """The whole loop on the embedded default: engine + proxy + trainer + a tool-using agent, learning live.
    The engine's output goes to engine.log and every log to rlproxy.log, in --workdir."""
    require("demo", "demo")
    from demo.main import run_demo

    DEMO_FLAGS.apply_set(params, overrides)
    train = DEMO_FLAGS.build(TrainConfig, params)
    settings = DEMO_FLAGS.build(DemoSettings, params, train=train)
    settings.workdir.mkdir(parents=True, exist_ok=True)
    sys.exit(run_demo(settings, _database_dir(settings.database_url, settings.workdir)))


def _database_dir(database_url: str, fallback: Path) -> Path:
    """The folder of a SQLite database file (the curve goes next to it), else `fallback`."""
    from sqlalchemy.engine import make_url

    url = make_url(database_url)
    if url.get_backend_name() == "sqlite" and url.database:
        return Path(url.database).resolve().parent
    return fallback
