"""What the commands beyond the proxy need: `pip install rlproxy` (no extras) serves and migrates; the engine,
the trainer and the demo need pyproject's extras. A command that needs one that is not installed says so in one
line (exit 2) instead of failing with an ImportError's traceback somewhere inside."""
from __future__ import annotations

import importlib.util

import click

from core.errors import RlproxyError

# The modules each extra installs that rlproxy imports, checked by name only (finding a module does not run it).
MODULES = {
    "engine": ("vllm",),
    "train": ("torch", "transformers", "peft", "gguf"),
    "demo": ("vllm", "torch", "transformers", "peft", "gguf", "openai"),  # rlproxy[demo] = engine + train + openai
}


class MissingExtra(RlproxyError, click.ClickException):
    exit_code = 2  # as click's usage errors: the command cannot run as installed


def require(command: str, extra: str, modules: tuple[str, ...] | None = None) -> None:
    """Exit with a one-line message naming `pip install 'rlproxy[<extra>]'` when a module `command` needs (by
    default every module of `extra`) is not installed."""
    missing = [name for name in modules or MODULES[extra] if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingExtra(f"`rlproxy {command}` needs {', '.join(missing)}, not installed here: "
                           f"pip install 'rlproxy[{extra}]'")
