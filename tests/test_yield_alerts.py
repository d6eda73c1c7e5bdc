"""The yield ALERT: a policy whose recent calls are mostly skipped for one reason is told which reason and what
fixes it, once until it clears (trainer/yields.py). Pure: no model, no database."""
from __future__ import annotations

import logging

from core.settings import TrainingSettings
from trainer.metrics import TrainerMetrics
from trainer.yields import YieldWatch


def report(trained: int, **skipped: int) -> dict:
    seen = trained + sum(skipped.values())
    return {"calls_seen": seen, "calls_trained": trained, "calls_skipped": skipped, "agents": {}}


def alerts(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("ALERT")]


def test_a_reason_that_skips_most_of_a_policys_recent_calls_is_named_once_with_its_fix(caplog):
    caplog.set_level(logging.INFO, logger="rlproxy.trainer")
    watch = YieldWatch(TrainerMetrics(), TrainingSettings(yield_window=3))
    assert watch.observe("coder", report(8, too_long=2)) == []  # 20%: nothing to say
    assert watch.observe("coder", report(0, sampling_altered=10)) == []  # 10 of 20 over the window: not more than half
    assert watch.observe("coder", report(0, sampling_altered=10)) == ["sampling_altered"]
    assert watch.observe("coder", report(0, sampling_altered=10)) == []  # said once while it lasts
    [alert] = alerts(caplog)
    assert "policy 'coder'" in alert and "sampling_altered" in alert and "drop it from the agent" in alert
    assert watch.metrics.yield_alerts.labels("coder", "sampling_altered")._value.get() == 1
    for _ in range(3):
        watch.observe("coder", report(10))  # cleared: the window trains again
    assert watch.observe("coder", report(0, sampling_altered=40)) == ["sampling_altered"]  # and it may fire again


def test_no_alert_with_a_share_of_0():
    watch = YieldWatch(TrainerMetrics(), TrainingSettings(yield_alert_share=0))
    assert watch.observe("coder", report(0, too_long=10)) == []
