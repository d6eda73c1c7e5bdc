"""What the trainer worker reports of a step: its metrics into Prometheus, its skip reasons into log lines."""
from __future__ import annotations

import statistics
from typing import Any

from trainer.metrics import TrainerMetrics
from trainer.transitions import Transition


def observe_step(m: TrainerMetrics, step: dict[str, Any], transitions: list[Transition], seconds: float) -> None:
    """A step's metrics into the trainer's gauges and counters."""
    for name, gauge in (("loss", m.loss), ("policy_loss", m.policy_loss), ("kl", m.kl),
                        ("clip_fraction", m.clip_fraction), ("tokens_per_s", m.tokens_per_second),
                        ("off_policy_kl", m.off_policy_kl), ("is_weight_max", m.is_weight_max),
                        ("is_filtered", m.is_filtered)):
        if step.get(name) is not None:
            gauge.set(step[name])
    advantages = [a for t in transitions for a, keep in zip(t.advantages(), t.mask()) if keep]
    m.advantage_std.set(statistics.pstdev(advantages) if len(advantages) > 1 else 0.0)
    m.tokens.inc(sum(t.num_trained_tokens() for t in transitions))
    m.step_duration.observe(seconds)


def merged(skipped: dict[str, dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for reasons in skipped.values():
        for reason, count in reasons.items():
            total[reason] = total.get(reason, 0) + count
    return total


def reasons(skipped: dict[str, int]) -> str:
    """`stale_policy 3, zero_advantage 12` (or `none`), for the log lines."""
    return ", ".join(f"{reason} {count}" for reason, count in sorted(skipped.items()) if count) or "none"
