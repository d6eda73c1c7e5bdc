"""The training core: transitions from recorded calls, LoRA PPO on them, atomic adapter publishing.

`config` and `transitions` are plain Python (no torch); the torch-side names are imported on first use.
"""
from __future__ import annotations

from typing import Any

from trainer.config import TrainConfig
from trainer.transitions import Call, SkipReasons, Transition, merge_trajectory, pack_micro_batches

_LAZY = {
    "PolicyTrainer": "trainer.ppo",
    "StepMetrics": "trainer.step_metrics",
    "save_adapter_atomically": "trainer.adapter",
    "load_adapter": "trainer.adapter",
    "import_openrlhf": "trainer.compat",
}

__all__ = [
    "TrainConfig", "Call", "SkipReasons", "Transition", "merge_trajectory", "pack_micro_batches", *_LAZY
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")
