"""What a trained, loaded candidate must pass before it serves (`TrainerSettings.gate`, docs/gates.md), as the
worker's `on_published` hook: True promotes it, False retires it and training continues from the policy that
serves, None leaves it undecided for the next run.

    none          no hook: the worker activates every new version at once
    canary        it answers `canary_fraction` of new rollouts and is promoted once it has answered
                  `canary_min_rollouts` finished rollouts whose mean reward is not worse than the active
                  policy's over the same period by more than `gate_margin`, else retired (canary.py)
    eval-traffic  the same judge on evaluation traffic only: it answers `eval_fraction` of new evaluation
                  rollouts, and production traffic never sees it before it is promoted (canary.py)
    command       the user's own evaluation script (`eval_command`) scores it and its parent on a URL that
                  serves each; not worse by more than `gate_margin` promotes it (command.py)

`gate="heldout"` is the bundled demo's own configuration of `command` (the settings model makes it, however they
are built: core/settings/train.py `demo_score_command`); the
trainer knows nothing of any task.
"""
from __future__ import annotations

from core.settings import TrainerSettings
from trainer.gates.canary import CanaryGate, judge
from trainer.gates.command import CommandGate

__all__ = ["CanaryGate", "CommandGate", "build_gate", "judge"]


def build_gate(settings: TrainerSettings, *, metrics=None):
    """The worker's `on_published` hook for `settings.gate` (None for "none")."""
    if settings.gate == "command":
        return CommandGate(settings, metrics=metrics)
    if settings.gate in ("canary", "eval-traffic"):
        return CanaryGate(settings, metrics=metrics)
    return None
