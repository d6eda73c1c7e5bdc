"""Off-policy training (docs/learning.md, Off-policy correction) on a tiny random Llama: decoupled PPO's proximal
log-probs, the importance weight on stale calls, the agreement on calls the held version sampled, and the staleness
accounting of the batch builder."""
from __future__ import annotations

import math

import pytest

from core.settings import TrainingSettings
from trainer.transitions import SkipReasons

torch = pytest.importorskip("torch")

from tests.trainer_support import make_trainer, on_policy_batch  # noqa: E402


@pytest.mark.train
def test_later_mini_batches_take_their_ratio_against_the_policy_before_the_steps_first_update(tiny_model):
    """Decoupled PPO: on an on-policy batch the proximal log-probs of every mini-batch are those before the first
    update, so the importance weight (proximal / engine) is exactly 1 everywhere, while the PPO ratio of the later
    mini-batches shows how far this step's own earlier updates moved the policy."""
    trainer = make_trainer(tiny_model, mini_batches=4, kl_coef=0.0, learning_rate=1e-2)
    m = trainer.step(on_policy_batch(trainer, n=8))
    assert m.updates == 4
    assert m.is_weight_max == pytest.approx(1.0, abs=1e-4) and m.is_filtered == 0.0
    assert m.ratio_max > 1.0 + 1e-3  # the updates before the second mini-batch moved it


@pytest.mark.train
def test_stale_calls_are_weighted_and_clipped_not_taken_as_the_ratio(tiny_model):
    """Calls an older policy sampled (its log-probs 1.5 below the trainer's on every token). Against the engine's
    log-probs (proximal_policy=behaviour) the ratio starts at e^1.5 = 4.5 and the clip drops every positive
    advantage's gradient; decoupled, the ratio starts at 1 and the staleness is an importance weight, clipped to 2
    (is_correction_low 0.5, is_correction_high 2)."""
    results = {}
    for proximal in ("recomputed", "behaviour"):
        trainer = make_trainer(tiny_model, mini_batches=2, kl_coef=0.0, proximal_policy=proximal)
        batch = on_policy_batch(trainer, n=8)
        for t in batch:
            t.behaviour_logprobs = [lp - 1.5 for lp in t.behaviour_logprobs]
        results[proximal] = trainer.step(batch)
    decoupled, behaviour = results["recomputed"], results["behaviour"]
    assert decoupled.ratio_mean == pytest.approx(1.0, abs=0.05) and decoupled.clip_fraction < 0.2
    assert decoupled.is_weight_mean == pytest.approx(math.exp(1.5), rel=1e-3) and decoupled.is_filtered == 1.0
    assert decoupled.off_policy_kl == pytest.approx(-1.5, abs=1e-3)
    assert behaviour.ratio_mean == pytest.approx(math.exp(1.5), rel=0.05) and behaviour.clip_fraction > 0.4
    assert behaviour.is_filtered == 0.0 and behaviour.is_weight_mean == 1.0  # no weight: nothing to weigh against


@pytest.mark.train
def test_agreement_is_measured_on_the_calls_the_held_version_sampled(tiny_model):
    """Rows whose calls version 3 sampled (the version the trainer holds) are compared with the engine's log-probs:
    an engine 0.5 off on those gives mean |diff| 0.5 and KL e^-0.5 - 1 + 0.5 per token; rows of older versions
    are not compared (their difference is staleness)."""
    trainer = make_trainer(tiny_model, kl_coef=0.0)
    batch = on_policy_batch(trainer, n=4)
    for i, t in enumerate(batch):
        t.policy_version = 3 if i < 2 else 1
        shift = 0.5 if i < 2 else 2.0
        t.behaviour_logprobs = [lp + shift for lp in t.behaviour_logprobs]
    m = trainer.step(batch, served_version=3)
    assert m.served_version == 3 and m.agreement_tokens == 12  # two rows of six completion tokens
    assert m.agreement_abs == pytest.approx(0.5, abs=1e-4)
    assert m.agreement_kl == pytest.approx(math.exp(-0.5) - 1 + 0.5, abs=1e-4)
    assert trainer.step(batch).agreement_kl is None  # no version named: nothing compared


def test_correction_settings_that_cannot_work_together_are_refused():
    for bad in ({"is_correction_level": "seq"}, {"is_correction_gating": "tv", "is_correction_mode": "mask"},
                {"dual_clip": 0.5}, {"is_correction_low": 2.0, "is_correction_high": 0.5}):
        with pytest.raises(ValueError):
            TrainingSettings(**bad)
    TrainingSettings(is_correction_gating="tv", is_correction_mode="mask", is_correction_low=0.0, is_correction_high=0.2)
    TrainingSettings(is_correction_level="seq", proximal_policy="behaviour")  # unused then: no complaint


def test_stale_calls_within_the_bound_are_trained_and_the_rest_counted_once_by_lag():
    """The trainer is at v10. A call of v4 (lag 6, within max_staleness 8) is trained; one of v1 (lag 9) is dropped
    and counted once, as stale_policy at lag 9, not again as a rollout without calls; a rollout that has no calls at
    all is one. Each kept call's age since the engine sampled it is recorded too."""
    from datetime import timedelta

    from store.models import utcnow
    from store.training import CallData, RolloutData
    from trainer.batch import build_transitions
    from trainer.staleness import Staleness

    now = utcnow()

    def rollout(name: str, reward: float, version: int | None) -> RolloutData:
        calls = [] if version is None else [CallData(name, 0, "solver", version, [5, 6, 7], "first",
                                                     [([8, 9, 2], [-1.0, -1.0, -1.0])],
                                                     started_at=now - timedelta(seconds=30))]
        return RolloutData(name, "task", reward, now, calls)

    rollouts = [rollout("fresh", 1.0, 10), rollout("old", 0.0, 4), rollout("too-old", 0.0, 1),
                rollout("empty", 1.0, None)]
    skips, staleness = SkipReasons(), Staleness(now=now)
    transitions = build_transitions(rollouts, TrainingSettings(), 10, skips, staleness=staleness)
    assert sorted(t.call_id for t in transitions) == ["fresh", "old"]
    assert skips == {"stale_policy": 1, "rollout_without_calls": 1}
    record = staleness.as_dict()
    assert record["trained_by_lag"] == {"0": 1, "6": 1} and record["dropped_by_lag"] == {"9": 1}
    assert record["lag_max"] == 6 and record["age_s_max"] == pytest.approx(30, abs=1)
    assert staleness.describe() == "lag 0:1 6:1, stale dropped 9:1, age mean 30 s, max 30 s"
