"""docs/settings.md, written from the commands' settings models (core/settings/), as their flags are
(rlproxy/commands/flags.py):

    .venv/bin/python -m rlproxy.commands.settings_doc > docs/settings.md

tests/test_settings_flags.py fails when the committed page differs from what this prints."""
from __future__ import annotations

from rlproxy.cli import PREPARE_FLAGS
from rlproxy.commands.demo import DEMO_FLAGS
from rlproxy.commands.evaluate import EVAL_FLAGS
from rlproxy.commands.keys import CREATE_FLAGS, LIST_FLAGS, REVOKE_FLAGS
from rlproxy.commands.prune import PRUNE_FLAGS
from rlproxy.commands.run import RUN_FLAGS
from rlproxy.commands.serve import ENGINE_FLAGS, MIGRATE_FLAGS, SERVE_FLAGS
from rlproxy.commands.train import EXPORT_FLAGS, TRAIN_FLAGS

HEADER = """# Settings

Every setting of every command (`rlproxy serve`, `engine`, `train`, `demo`, `run`, `eval`, `prune`, `migrate`,
`keys`, `export`, `model prepare`), with its flag, its environment variable and its default. This page is
generated from the commands' settings models (`core/settings/`, one module per command) by `python -m
rlproxy.commands.settings_doc`; `--help` shows the same text. A flag given on the command line wins over its
environment variable, which wins over the default. A repeatable flag also takes comma-separated values (its
environment variable: separated by spaces). `rlproxy train --set NAME=VALUE` and `rlproxy demo --set
NAME=VALUE` set any of their settings by field name, and win over the flag. A setting that was renamed says so
in its row: its old flag and variable are still read (the new variable wins when both are set).

"""

SECTIONS = [(SERVE_FLAGS, "rlproxy serve"), (ENGINE_FLAGS, "rlproxy engine"),
            (TRAIN_FLAGS, "rlproxy train"),
            (DEMO_FLAGS, "rlproxy demo (training settings default to the demo's own)"),
            (RUN_FLAGS, "rlproxy run (docs/run.md)"), (EVAL_FLAGS, "rlproxy eval (docs/gates.md)"),
            (PRUNE_FLAGS, "rlproxy prune (docs/retention.md; the trainer's --prune-* are the same settings)"),
            (MIGRATE_FLAGS, "rlproxy migrate"), (CREATE_FLAGS, "rlproxy keys create"),
            (LIST_FLAGS, "rlproxy keys list"), (REVOKE_FLAGS, "rlproxy keys revoke (and its KEY_ID)"),
            (EXPORT_FLAGS, "rlproxy export"), (PREPARE_FLAGS, "rlproxy model prepare")]


def markdown() -> str:
    return HEADER + "\n".join(flags.markdown(title) for flags, title in SECTIONS)


if __name__ == "__main__":
    print(markdown(), end="")
