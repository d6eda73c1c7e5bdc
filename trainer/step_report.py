"""What the trainer worker reports of a step: its record into Prometheus and into the step's log line.

    observe_step(metrics, record, transitions, seconds)   # the gauges the record's fields name, and counters
    log.info(step_line(record, ...))                      # `step 3, policy 'default': 8 rollouts, ...`
"""
from __future__ import annotations

import statistics

from core.step_record import StepRecord
from trainer.agreement import Agreement
from trainer.metrics import TrainerMetrics
from trainer.transitions import Transition
from trainer.yields import describe_yield


def observe_step(m: TrainerMetrics, record: StepRecord, transitions: list[Transition], seconds: float) -> None:
    """A step's record into the trainer's gauges (one per field that names one) and counters."""
    for name, value in record.gauge_values():
        m.step_gauges[name].set(value)
    advantages = [a for t in transitions for a, keep in zip(t.advantages(), t.mask()) if keep]
    m.advantage_std.set(statistics.pstdev(advantages) if len(advantages) > 1 else 0.0)
    m.tokens.inc(sum(t.num_trained_tokens() for t in transitions))
    m.step_duration.observe(seconds)


def step_line(number: int, record: StepRecord, version: int, seconds: float, staleness: str,
              agreement: Agreement | None = None) -> str:
    """The step's log line, from its record (and the served agreement it measured)."""
    served = "" if agreement is None else f"; v{agreement.version} served as trained: KL {agreement.kl:.4f}"
    return (f"step {number}, policy {record.policy!r}: {record.rollouts} rollouts, {record.transitions} transitions, "
            f"reward {record.reward_mean:.3f}, loss {record.loss:.4f}, lr x{record.lr_scale:.2f} -> v{version} in "
            f"{seconds:.1f} s; {describe_yield(vars(record))}{_merge(record)}; dropped: {reasons(record.skipped)}; "
            f"{staleness}; IS weights clipped/masked {100 * record.is_filtered:.1f}%{served}")


def _merge(record: StepRecord) -> str:
    """`, merge ratio 3.50 calls a sequence` (calls trained per trained sequence) where the step trained calls."""
    return "" if record.merge_ratio is None else f", merge ratio {record.merge_ratio:.2f} calls a sequence"


def merged(skipped: dict[str, dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for reasons in skipped.values():
        for reason, count in reasons.items():
            total[reason] = total.get(reason, 0) + count
    return total


def reasons(skipped: dict[str, int]) -> str:
    """`stale_policy 3, zero_advantage 12` (or `none`), for the log lines."""
    return ", ".join(f"{reason} {count}" for reason, count in sorted(skipped.items()) if count) or "none"
