"""The `rlproxy` command: one module per command under rlproxy/commands/. Every flag also reads
`RLPROXY_<FLAG>` from the environment."""
from __future__ import annotations

import importlib
import logging
import os
import sys

import click

from core.settings.maintenance import ModelPrepareSettings
from engine.model import prepare_model
from rlproxy.commands.flags import Flags
from rlproxy.extras import require

# command -> (module under rlproxy/commands/, its click command). A command's module is imported when that
# command runs (or `rlproxy --help` lists them all): `rlproxy serve` loads the proxy's stack and not the
# runner's, the demo's or the trainer's, and starts about a second sooner.
COMMANDS = {
    "serve": ("serve", "serve"), "engine": ("serve", "engine"), "migrate": ("serve", "migrate"),
    "train": ("train", "train"), "train-config": ("train", "train_config"), "export": ("train", "export"),
    "eval": ("evaluate", "eval_"), "demo": ("demo", "demo"), "keys": ("keys", "keys"), "prune": ("prune", "prune"),
    "run": ("run", "run"),
}


class Commands(click.Group):
    """The commands of COMMANDS, each loaded on first use, beside those added the usual way (`model`)."""

    def list_commands(self, ctx: click.Context | None) -> list[str]:
        return sorted({*COMMANDS, *super().list_commands(ctx)})

    def get_command(self, ctx: click.Context | None, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return super().get_command(ctx, name)
        module, attribute = COMMANDS[name]
        return getattr(importlib.import_module(f"rlproxy.commands.{module}"), attribute)


def _logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    for chatty in ("httpx", "httpx2", "openai", "aiohttp.access"):  # one line per HTTP request otherwise
        logging.getLogger(chatty).setLevel(logging.DEBUG if verbose else logging.WARNING)
    # Alembic says which plugins it set up when it is first imported: noise in a user's terminal
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.DEBUG if verbose else logging.WARNING)


@click.group(cls=Commands)
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def main(verbose: bool) -> None:
    """rlproxy: an OpenAI-compatible proxy that records every policy call and trains what it serves."""
    _logging(verbose)
    # Before torch loads: spinning OpenMP threads made a training step 3-6x slower next to the engine on
    # shared cores; passive waiting gives the cores back.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@main.group()
def model() -> None:
    """The bundled model."""


PREPARE_FLAGS = Flags(ModelPrepareSettings)


@model.command("prepare")
@PREPARE_FLAGS
def model_prepare(**params) -> None:
    """Turn the bundled SmolLM2-135M-Instruct GGUF into a Hugging Face folder (idempotent); print its path."""
    settings = PREPARE_FLAGS.build(params)
    require("model prepare", "train", ("transformers", "gguf"))

    click.echo(str(prepare_model(settings.out)))


if __name__ == "__main__":
    main()
