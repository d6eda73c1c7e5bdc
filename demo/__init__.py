"""The bundled demo: a tool-using agent on locally generated tasks (see docs/demo-tasks.md).

    from demo import train_tasks, heldout_tasks, run_episode, evaluate

Nothing here downloads anything: tasks come from a seeded generator, the tool runs in-process.
"""
from __future__ import annotations

from demo.agent import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_MAX_TURNS,
    FEW_SHOT,
    PROMPTS,
    PROTOCOL,
    SYSTEM_PROMPT,
    EpisodeResult,
    EvalStats,
    Prompting,
    evaluate,
    evaluate_detailed,
    run_episode,
)
from demo.tasks import DEFAULT_FAMILY, FAMILIES, Task, heldout_tasks, train_tasks

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
