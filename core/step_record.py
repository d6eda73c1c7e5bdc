"""The step record: what one training step of one policy reports, typed once and read everywhere.

    metrics = tally.finish(...)                         # trainer/step_metrics.py: a StepMetrics
    record = StepRecord.of(metrics, policy=..., ...)    # the worker adds the batch's and the yield's fields
    record.as_dict()                                    # -> train_steps.metrics (store/training.py record_step)
    StepRecord.from_dict(row.metrics)                   # <- the store's readers (the web view's training page)
    for name, value in record.gauge_values(): ...       # -> the trainer's gauges (trainer/metrics.py)

The fields are the contract between the step, the log line, the store (`train_steps.metrics`), the metrics and
the Grafana panels: a gauge is made from each field that names one (`gauge` in its metadata; its Prometheus
name is `rlproxy_trainer_<field>` unless the field gives another), so a field renamed here renames its gauge,
and tests/test_dashboard.py fails on a panel that still queries the old name. A record stored before a field
existed reads back with that field's default.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

PREFIX = "rlproxy_trainer_"


def _gauge(description: str, name: str | None = None) -> dict[str, Any]:
    """Field metadata: the field's value is exported as a gauge after each step (`name` overrides the default
    `rlproxy_trainer_<field>`, for the names the gauges had before the record was typed)."""
    return {"gauge": description, "gauge_name": name}


@dataclass
class StepMetrics:
    """What the PPO step itself measures (trainer/step_metrics.py StepTally.finish)."""
    loss: float = field(default=0.0, metadata=_gauge("Total loss of the last step."))
    policy_loss: float = field(default=0.0, metadata=_gauge("PPO policy loss of the last step."))
    # KL(policy || base) per trained token; None when the reference pass is off
    kl: float | None = field(default=None, metadata=_gauge("KL to the base model in the last step."))
    clip_fraction: float = field(default=0.0, metadata=_gauge("Share of tokens clipped."))
    ratio_mean: float = 1.0  # PPO ratio policy / proximal (proximal_policy=behaviour: / behaviour) over trained tokens
    ratio_max: float = 1.0
    behaviour_kl: float = 0.0  # mean(behaviour logp - policy logp): how off-policy the batch is
    # Decoupled PPO (proximal_policy=recomputed), over trained tokens:
    off_policy_kl: float = field(default=0.0, metadata=_gauge(
        "Last step: mean(engine log-prob - trainer's proximal log-prob) per trained token: staleness and "
        "engine/trainer numerics together (proximal_policy=recomputed)."))
    is_weight_mean: float = 1.0  # importance weight proximal / behaviour, before the correction clips or masks it
    is_weight_max: float = field(default=1.0, metadata=_gauge(
        "Last step: the largest importance weight proximal / engine, before the correction clipped or masked it."))
    # share of trained tokens (or of sequences, level seq) the correction clipped or masked
    is_filtered: float = field(default=0.0, metadata=_gauge(
        "Last step: share of trained tokens (sequences, level seq) whose importance weight the correction "
        "clipped or masked.", "rlproxy_trainer_is_filtered_fraction"))
    # The engine's log-probs against the trainer's on the calls the version the trainer holds sampled (lag 0),
    # per token: KL (k3 estimate) and mean |difference|; None when no call of the batch had lag 0.
    served_version: int | None = None
    agreement_kl: float | None = None
    agreement_abs: float | None = None
    agreement_tokens: int = 0
    entropy: float = 0.0
    grad_norm: float = 0.0
    transitions: int = 0
    micro_batches: int = 0
    updates: int = 0  # optimizer steps taken (ppo_epochs x mini-batches)
    tokens: int = 0  # prompt + completion tokens through the model (all epochs)
    trained_tokens: int = 0  # model-sampled tokens in the loss (one epoch)
    tokens_per_s: float = field(default=0.0, metadata=_gauge("Training throughput.",
                                                             "rlproxy_trainer_tokens_per_second"))
    duration_s: float = 0.0
    step: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # transitions (or rollouts) dropped, by reason

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class StepRecord(StepMetrics):
    """One policy's step as the worker records it: the PPO step's metrics, the batch it came from, and the
    yield (calls seen, trained and skipped by reason, per agent name: trainer/yields.py call_yield)."""
    policy: str = ""
    rollouts: int = 0
    usable_rollouts: int = 0  # rollouts of the batch in a group with an advantage (zero-advantage ones count)
    lr_scale: float = 1.0
    reward_mean: float = 0.0
    staleness: dict[str, Any] = field(default_factory=dict)  # trainer/staleness.py Staleness.as_dict
    calls_seen: int = 0
    calls_trained: int = 0
    calls_skipped: dict[str, int] = field(default_factory=dict)  # per call, by reason
    agents: dict[str, Any] = field(default_factory=dict)  # agent name -> {calls_seen, calls_trained, skipped}
    # a policy with a teacher (trainer/distill.py): its TeacherReport, and the mean reverse KL per scored token
    # (the gauge rlproxy_trainer_teacher_kl{policy} is set by trainer/distill.py, labelled by policy)
    teacher: dict[str, Any] | None = None
    teacher_kl: float | None = None
    # calls trained per trained sequence: 1 when no call merged into the one before it (docs/training.md, the
    # merge per model family); None when the step trained nothing. Set from the two counts when not given.
    merge_ratio: float | None = field(default=None, metadata=_gauge(
        "Last step: calls trained per trained sequence (the merge ratio; 1: no call merged with the one before)."))

    def __post_init__(self) -> None:
        if self.merge_ratio is None and self.transitions and self.calls_trained:
            self.merge_ratio = round(self.calls_trained / self.transitions, 4)

    @classmethod
    def of(cls, metrics: StepMetrics, **more: Any) -> StepRecord:
        """The step's metrics with the worker's fields (a field of both, `skipped`, takes the worker's)."""
        return cls(**{**asdict(metrics), **more})

    @classmethod
    def from_dict(cls, stored: dict[str, Any] | None) -> StepRecord:
        """A stored record read back: fields it lacks (recorded before they existed) take their defaults; keys
        that are no field (a failed step's `failed`, an untrained step's `policies`) are left out."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (stored or {}).items() if k in known})

    def gauge_values(self) -> list[tuple[str, float]]:
        """(field, value) of every field exported as a gauge that has a value."""
        return [(f.name, getattr(self, f.name)) for f in fields(self)
                if "gauge" in f.metadata and getattr(self, f.name) is not None]


def gauge_fields() -> dict[str, tuple[str, str]]:
    """field -> (Prometheus name, help) of every step record field exported as a gauge."""
    return {f.name: (f.metadata["gauge_name"] or PREFIX + f.name, f.metadata["gauge"])
            for f in fields(StepRecord) if "gauge" in f.metadata}


def field_names() -> frozenset[str]:
    return frozenset(f.name for f in fields(StepRecord))
