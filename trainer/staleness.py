"""How stale a step's calls are, and how many were dropped for it.

Two kinds of lag, both per call: in versions (how many versions of its policy's line the trainer has moved on since
the version that sampled it, `max_staleness` bounding it) and in seconds (since the engine sampled it: a call that
waited long in the queue was sampled under traffic conditions as old as that). trainer/batch.py counts them while it
selects calls; the worker reports them per step in the `rlproxy train` log line, the metrics
(trainer/metrics.py) and the step record (`train_steps.metrics["staleness"]`).

    staleness = Staleness(now=utcnow())
    build_transitions(..., staleness=staleness)
    staleness.as_dict()   # {"trained_by_lag": {"0": 12, "1": 4}, "dropped_by_lag": {"9": 2}, "lag_mean": ..., ...}
"""
from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from store.models import as_utc


@dataclass
class Staleness:
    now: datetime
    trained: Counter = field(default_factory=Counter)  # calls kept for training, by lag in versions
    dropped: Counter = field(default_factory=Counter)  # calls dropped as stale (`stale_policy`), by lag in versions
    ages: list[float] = field(default_factory=list)  # seconds since the engine sampled each kept call

    def kept(self, lag: int, sampled_at: datetime | None) -> None:
        self.trained[lag] += 1
        if sampled_at is not None:
            self.ages.append(max(0.0, (self.now - as_utc(sampled_at)).total_seconds()))

    def drop(self, lag: int) -> None:
        self.dropped[lag] += 1

    def merge(self, other: "Staleness") -> None:
        self.trained.update(other.trained)
        self.dropped.update(other.dropped)
        self.ages.extend(other.ages)

    def as_dict(self) -> dict[str, Any]:
        """What the step record stores (JSON: lags as text keys)."""
        lags = list(self.trained.elements())
        return {
            "trained_by_lag": {str(lag): n for lag, n in sorted(self.trained.items())},
            "dropped_by_lag": {str(lag): n for lag, n in sorted(self.dropped.items())},
            "lag_mean": statistics.fmean(lags) if lags else None,
            "lag_max": max(lags) if lags else None,
            "age_s_mean": statistics.fmean(self.ages) if self.ages else None,
            "age_s_max": max(self.ages) if self.ages else None,
        }

    def describe(self) -> str:
        """For the log line: `lag 0:12 1:4, stale dropped 9:2, age mean 12 s, max 40 s`."""
        parts = ["lag " + (" ".join(f"{lag}:{n}" for lag, n in sorted(self.trained.items())) or "-")]
        if self.dropped:
            parts.append("stale dropped " + " ".join(f"{lag}:{n}" for lag, n in sorted(self.dropped.items())))
        if self.ages:
            parts.append(f"age mean {statistics.fmean(self.ages):.0f} s, max {max(self.ages):.0f} s")
        return ", ".join(parts)

    def observe(self, metrics) -> None:
        """Into the trainer's histograms (trainer/metrics.py)."""
        for lag, n in self.trained.items():
            for _ in range(n):
                metrics.trained_call_lag.observe(lag)
        for lag, n in self.dropped.items():
            for _ in range(n):
                metrics.dropped_call_lag.observe(lag)
        for age in self.ages:
            metrics.trained_call_age.observe(age)
