"""`rlproxy demo`: the whole loop on the bundled model."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from rlproxy.commands.options import database_option, option
from rlproxy.commands.train import train_config_from


@click.command()
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
