"""docs/settings.md, written from the settings models that make the flags (rlproxy/commands/flags.py):

    .venv/bin/python -m rlproxy.commands.settings_doc > docs/settings.md

tests/test_settings_flags.py fails when the committed page differs from what this prints."""
from __future__ import annotations

HEADER = """# Settings

Every setting of `rlproxy serve`, `rlproxy engine`, `rlproxy train`, `rlproxy demo` and `rlproxy run`, with
its flag, its environment variable and its default. This page is generated from the settings models
(`core/settings.py`, `trainer/config.py`, `demo/settings.py`, `runner/settings.py`) by `python -m
rlproxy.commands.settings_doc`; `--help` shows the same text. A flag given on the command line wins over its
environment variable, which wins over the default. A repeatable flag also takes comma-separated values (its
environment variable: separated by spaces). `rlproxy train --set NAME=VALUE` and `rlproxy demo --set
NAME=VALUE` set any of their settings by field name.

"""


def markdown() -> str:
    from rlproxy.commands.demo import DEMO_FLAGS
    from rlproxy.commands.run import RUN_FLAGS
    from rlproxy.commands.serve import ENGINE_FLAGS, SERVE_FLAGS
    from rlproxy.commands.train import TRAIN_FLAGS

    sections = [SERVE_FLAGS.markdown("rlproxy serve"), ENGINE_FLAGS.markdown("rlproxy engine"),
                TRAIN_FLAGS.markdown("rlproxy train"),
                DEMO_FLAGS.markdown("rlproxy demo (training settings default to the demo's own)"),
                RUN_FLAGS.markdown("rlproxy run (docs/run.md)")]
    return HEADER + "\n".join(sections)


if __name__ == "__main__":
    print(markdown(), end="")
