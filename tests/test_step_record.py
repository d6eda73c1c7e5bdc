"""The step record (core/step_record.py) is one type from the PPO step to the log line, the store and the gauges."""
from __future__ import annotations

from dataclasses import fields

from prometheus_client import generate_latest

from core.step_record import StepMetrics, StepRecord, field_names, gauge_fields
from trainer.metrics import TrainerMetrics
from trainer.step_report import observe_step, step_line


def a_record() -> StepRecord:
    metrics = StepMetrics(loss=0.25, policy_loss=0.2, kl=None, clip_fraction=0.1, tokens_per_s=512.0,
                          is_filtered=0.05, transitions=6, skipped={"from_the_step": 1})
    return StepRecord.of(metrics, policy="solver", rollouts=8, usable_rollouts=6, lr_scale=0.75, reward_mean=0.5,
                         skipped={"zero_advantage": 2}, calls_seen=10, calls_trained=7,
                         calls_skipped={"zero_advantage": 2, "sampling_altered": 1},
                         agents={"a": {"calls_seen": 10, "calls_trained": 7, "skipped": {"zero_advantage": 2}}})


def test_a_record_is_stored_and_read_back_whole():
    record = a_record()
    assert record.skipped == {"zero_advantage": 2}  # the worker's count replaces the step's own
    assert StepRecord.from_dict(record.as_dict()) == record


def test_a_record_stored_before_a_field_existed_reads_with_its_default():
    older = {"loss": 0.5, "policy": "solver", "failed": "RuntimeError: boom"}  # `failed`: no field, left out
    read = StepRecord.from_dict(older)
    assert read.loss == 0.5 and read.calls_seen == 0 and read.calls_skipped == {} and read.kl is None


def test_each_gauge_is_made_from_a_field_and_set_from_the_record():
    metrics = TrainerMetrics()
    observe_step(metrics, a_record(), [], 1.0)
    exported = generate_latest(metrics.registry).decode()
    assert "rlproxy_trainer_loss 0.25" in exported and "rlproxy_trainer_tokens_per_second 512.0" in exported
    assert "rlproxy_trainer_is_filtered_fraction 0.05" in exported
    assert "rlproxy_trainer_kl 0.0" in exported  # None (no reference pass) leaves the gauge where it was
    names = gauge_fields()
    assert set(names) <= field_names() and names["loss"][0] == "rlproxy_trainer_loss"
    assert all("gauge" in f.metadata for f in fields(StepRecord) if f.name in names)


def test_the_log_line_reads_the_record():
    line = step_line(3, a_record(), 4, 2.5, "lag 0-1")
    assert line.startswith("step 3, policy 'solver': 8 rollouts, 6 transitions, reward 0.500, loss 0.2500")
    assert "lr x0.75 -> v4 in 2.5 s; 7/10 calls trained (zero_advantage 2, sampling_altered 1)" in line
    assert "dropped: zero_advantage 2; lag 0-1; IS weights clipped/masked 5.0%" in line


def test_the_merge_ratio_is_calls_trained_per_trained_sequence_in_the_record_its_gauge_and_the_log_line():
    record = a_record()  # 7 calls trained in 6 sequences
    assert record.merge_ratio == 1.1667 and StepRecord.from_dict(record.as_dict()).merge_ratio == 1.1667
    assert StepRecord.from_dict({"transitions": 2, "calls_trained": 8}).merge_ratio == 4.0  # stored before the field
    assert StepRecord.from_dict({"loss": 0.5}).merge_ratio is None  # nothing trained: no ratio
    metrics = TrainerMetrics()
    observe_step(metrics, record, [], 1.0)
    assert "rlproxy_trainer_merge_ratio 1.1667" in generate_latest(metrics.registry).decode()
    assert "7/10 calls trained (zero_advantage 2, sampling_altered 1), merge ratio 1.17 calls a sequence;" in (
        step_line(3, record, 4, 2.5, "lag 0-1"))
