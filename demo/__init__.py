"""The bundled demo: a tool-using agent on locally generated tasks (see docs/demo-tasks.md).

    from demo import train_tasks, heldout_tasks, run_episode, evaluate

Nothing here downloads anything: tasks come from a seeded generator, the tool runs in-process.
"""
from __future__ import annotations

from typing import Any

# Imported on first use: the agent needs `openai`, which the proxy alone (`pip install rlproxy`) does not
# install.
_LAZY = {name: "demo.agent" for name in (
    "DEFAULT_MAX_TOKENS", "DEFAULT_MAX_TURNS", "FEW_SHOT", "PROMPTS", "PROTOCOL", "SYSTEM_PROMPT", "EpisodeResult",
    "EvalStats", "Prompting", "evaluate", "evaluate_detailed", "run_episode")}
_LAZY |= {name: "demo.tasks" for name in ("DEFAULT_FAMILY", "FAMILIES", "Task", "heldout_tasks", "train_tasks")}

__all__ = [
    "DEFAULT_FAMILY",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_MAX_TURNS",
    "FAMILIES",
    "FEW_SHOT",
    "PROMPTS",
    "PROTOCOL",
    "SYSTEM_PROMPT",
    "EpisodeResult",
    "EvalStats",
    "Prompting",
    "Task",
    "evaluate",
    "evaluate_detailed",
    "heldout_tasks",
    "run_episode",
    "train_tasks",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'demo' has no attribute {name!r}")
