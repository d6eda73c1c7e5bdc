"""`rlproxy demo`: the whole loop on the bundled model."""
from __future__ import annotations

import sys
from pathlib import Path

import click
from sqlalchemy.engine import make_url

from core.settings import DemoSettings
from rlproxy.commands.flags import Flags
from rlproxy.extras import require

# The demo's training flags are the trainer's, with the demo's own defaults (core/settings/demo.py)
DEMO_FLAGS = Flags(DemoSettings)


@click.command()
@DEMO_FLAGS
@click.option("--set", "pairs", multiple=True, metavar="NAME=VALUE",
              help="Any setting above by its field name, e.g. --set group_size=4 (--set wins).")
def demo(pairs, **params) -> None:
    """The whole loop on the embedded default: engine + proxy + trainer + a tool-using agent, learning live.
    The engine's output goes to engine.log and every log to rlproxy.log, in --workdir."""
    require("demo", "demo")
    settings = DEMO_FLAGS.build(params, pairs)
    from demo.main import run_demo  # the demo's agent, engine and trainer: rlproxy[demo] (torch, vLLM, openai)

    settings.workdir.mkdir(parents=True, exist_ok=True)
    sys.exit(run_demo(settings, _database_dir(settings.database_url, settings.workdir)))


def _database_dir(database_url: str, fallback: Path) -> Path:
    """The folder of a SQLite database file (the curve goes next to it), else `fallback`."""
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite" and url.database:
        return Path(url.database).resolve().parent
    return fallback
