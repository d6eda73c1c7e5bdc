"""Which rollouts make a task's group: the group is what the step trains. Pure (no torch, no database)."""
from __future__ import annotations

import pytest

from store.models import utcnow
from store.training import CallData, RolloutData
from core.settings import TrainingSettings
from trainer.batch import build_transitions
from trainer.transitions import SkipReasons

NOW = utcnow()


def rollout(name: str, reward: float, *, version: int | None = 3, call_rewards: tuple[float, ...] = (),
            sampling: str | None = None) -> RolloutData:
    """One rollout of task "t" with one answered call (none when `version` is None: every call failed)."""
    calls = [] if version is None else [CallData(name, 0, "solver", version, [5, 6, 7], "first",
                                                 [([8, 9, 2], [-1.0, -1.0, -1.0])], rewards=list(call_rewards),
                                                 started_at=NOW, sampling=sampling)]
    return RolloutData(name, "t", reward, NOW, calls)


def test_rollouts_whose_calls_all_failed_do_not_make_identical_successes_look_good():
    """Five identical successes and three attempts the engine failed (502s; the agent posted 0): the five are
    compared with each other only, so there is nothing to learn, not +0.775 each."""
    batch = [rollout(f"ok{i}", 1.0) for i in range(5)] + [rollout(f"failed{i}", 0.0, version=None) for i in range(3)]
    skips = SkipReasons()
    assert build_transitions(batch, TrainingSettings(), 3, skips) == []
    assert skips == {"zero_advantage": 5, "rollout_without_calls": 3}


def test_calls_dropped_as_stale_leave_their_rollouts_out_of_the_baseline_too():
    settings = TrainingSettings(max_staleness=2)
    batch = [rollout("new-a", 1.0, version=10), rollout("new-b", 0.0, version=10), rollout("old", 0.0, version=1)]
    skips = SkipReasons()
    transitions = build_transitions(batch, settings, 10, skips)
    advantages = {t.call_id: t.advantages()[0] for t in transitions}
    assert advantages["new-a"] == -advantages["new-b"] > 0  # a group of two: the old rollout's 0 is not in it
    assert skips == {"stale_policy": 1}


def test_a_reward_stored_past_the_bound_is_skipped_not_squared():
    """1e300 is finite; the group's variance would overflow. Every door refuses it now (core/checks.py); a row
    stored before that is skipped with its reason, and the rest of the batch trains."""
    batch = [rollout("vast", 1e300), rollout("a", 1.0), rollout("b", 0.0), rollout("vast-call", 1.0, call_rewards=(-1e300,))]
    skips = SkipReasons()
    transitions = build_transitions(batch, TrainingSettings(), 3, skips)
    assert sorted(t.call_id for t in transitions) == ["a", "b"]
    assert skips == {"invalid_reward": 2}


def test_a_call_sampled_at_another_temperature_is_not_trained_on_its_raw_log_probs():
    batch = [rollout("a", 1.0), rollout("b", 0.0), rollout("warm", 1.0, sampling="temperature=0.7")]
    skips = SkipReasons()
    transitions = build_transitions(batch, TrainingSettings(), 3, skips)
    assert sorted(t.call_id for t in transitions) == ["a", "b"]
    assert skips == {"sampling_altered": 1}


def test_a_call_with_an_image_in_its_prompt_is_skipped_under_its_own_reason():
    batch = [rollout("a", 1.0), rollout("b", 0.0), rollout("seen", 1.0, sampling="media=image_url")]
    skips = SkipReasons()
    transitions = build_transitions(batch, TrainingSettings(), 3, skips)
    assert sorted(t.call_id for t in transitions) == ["a", "b"]
    assert skips == {"media_in_prompt": 1}


def test_two_projects_tasks_of_the_same_id_are_different_groups():
    """Projects alpha and beta both run a benchmark whose first task is "t": alpha's two attempts are compared
    with each other, beta's with each other; beta's failures are not alpha's baseline."""
    alpha = [rollout("alpha-1", 1.0), rollout("alpha-2", 1.0)]
    beta = [rollout("beta-1", 0.0), rollout("beta-2", 0.0)]
    for r in alpha:
        r.project = "alpha"
    for r in beta:
        r.project = "beta"
    skips = SkipReasons()
    assert build_transitions(alpha + beta, TrainingSettings(), 3, skips) == []  # nothing to learn in either group
    assert skips == {"zero_advantage": 4}


def test_discounted_credit_discounts_the_advantage_not_the_reward():
    """Four successes of five calls each: nothing to learn, discounted or not. Discounting the raw return before
    the undiscounted reward was taken off gave their early calls -0.34 ... -0.1."""
    def episode(name: str, reward: float) -> RolloutData:
        calls = [CallData(f"{name}-{t}", t, "solver", 3, [5, 6, 7 + t], "first", [([8, 9, 2], [-1.0] * 3)],
                          started_at=NOW) for t in range(5)]
        return RolloutData(name, "t", reward, NOW, calls)

    settings = TrainingSettings(credit="discounted", gamma=0.9)
    skips = SkipReasons()
    assert build_transitions([episode(f"ok{i}", 1.0) for i in range(4)], settings, 3, skips) == []
    assert skips == {"zero_advantage": 20}
    transitions = build_transitions([episode("won", 1.0), episode("lost", 0.0)], settings, 3, SkipReasons())
    first = {t.call_id: t.advantages()[0] for t in transitions}
    assert first["won-4"] > first["won-0"] > 0 > first["lost-0"] > first["lost-4"]  # later calls weigh more
    assert first["won-0"] == pytest.approx(0.9 ** 4 * first["won-4"])


def test_a_tempered_call_with_processed_log_probs_is_trained_at_its_own_settings():
    """The engine recorded the probabilities the tokens were drawn with: the transition carries the call's settings
    for the trainer to score it by. Without `logprobs_mode` (every call recorded before it existed: raw log-probs)
    the same call is skipped, as above."""
    warm = rollout("warm", 1.0, sampling="temperature=0.7 top_p=0.95 top_k=20")
    warm.calls[0].logprobs_mode = "processed"
    skips = SkipReasons()
    transitions = build_transitions([rollout("a", 0.0), warm], TrainingSettings(), 3, skips)
    sampled = {t.call_id: t.sampled for t in transitions}
    assert sampled["a"] is None
    assert (sampled["warm"].temperature, sampled["warm"].top_p, sampled["warm"].top_k) == (0.7, 0.95, 20)
    assert skips.decisions == {"a": "trained", "warm": "trained"}


@pytest.mark.parametrize("sampling, reason", [
    ("temperature=0", "greedy_sampling"),  # no token was drawn at its probability: the greedy ALERT says what to set
    ("logit_bias", "sampling_altered"),
    ("presence_penalty=0.5", "sampling_altered"),
    ("response_format=json_schema", "sampling_altered"),
    ("media=image_url", "media_in_prompt"),
])
def test_what_the_trainer_cannot_rebuild_is_skipped_with_its_reason_stored_per_call(sampling, reason):
    odd = rollout("odd", 1.0, sampling=sampling)
    odd.calls[0].logprobs_mode = "processed"
    skips = SkipReasons()
    build_transitions([rollout("a", 1.0), rollout("b", 0.0), odd], TrainingSettings(), 3, skips)
    assert skips == {reason: 1} and skips.decisions["odd"] == reason


def test_a_call_longer_than_any_old_bound_is_kept_when_max_seq_len_is_0():
    long = RolloutData("long", "t", 1.0, NOW, [CallData("long", 0, "solver", 3, list(range(3, 9000)), "first",
                                                        [([8, 9, 2], [-1.0, -1.0, -1.0])], started_at=NOW)])
    skips = SkipReasons()
    transitions = build_transitions([long, rollout("b", 0.0)], TrainingSettings(max_seq_len=0), 3, skips)
    assert sorted(t.call_id for t in transitions) == ["b", "long"] and not skips
