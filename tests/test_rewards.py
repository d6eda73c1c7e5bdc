"""The rewards package: credit assignment, advantages and outcome scorers (AIR: tests/test_rewards_air.py)."""
from __future__ import annotations

import math

import pytest

from rewards.advantages import (
    ESTIMATORS,
    batch_baseline,
    group_advantages,
    grpo,
    normalize,
    reinforce,
    reinforce_baseline,
    rloo,
)
from rewards.air import (
    AIR_REASONS,
    score_tool_calls,
)
from rewards.credit import CreditMode, assign_credit
from rewards.scorers import contains, exact_match, json_valid, last_number, numeric_match

EPS = 1e-6


def test_package_exports_the_public_api():
    import rewards

    if getattr(rewards, "__file__", None) is None:
        # An editable install made before rewards/__init__.py existed maps `rewards` to a namespace package.
        pytest.skip("stale editable install; `pip install --no-deps -e .` picks up rewards/__init__.py")
    for name in rewards.__all__:
        assert hasattr(rewards, name), name
    assert rewards.assign_credit is assign_credit and rewards.score_tool_calls is score_tool_calls
    assert ESTIMATORS == ("grpo", "rloo", "reinforce_baseline", "reinforce")
    assert AIR_REASONS == ("invalid_arguments", "unknown_tool", "tool_error", "tool_success")


# --- credit -------------------------------------------------------------------------------------


def test_identical_credit_gives_every_call_the_final_return():
    assert assign_credit(1.0, 3) == [1.0, 1.0, 1.0]


def test_discounted_credit_decays_towards_the_first_call():
    # gamma^(T-1-t) * R with T=3, gamma=0.5: 0.25, 0.5, 1.0
    assert assign_credit(1.0, 3, mode="discounted", gamma=0.5) == [0.25, 0.5, 1.0]
    assert assign_credit(-2.0, 2, mode=CreditMode.DISCOUNTED, gamma=0.5) == [-1.0, -2.0]


def test_discounted_with_gamma_one_equals_identical():
    assert assign_credit(0.7, 4, mode="discounted", gamma=1.0) == assign_credit(0.7, 4)


def test_intermediate_rewards_as_a_list_go_to_their_own_call():
    per_call = [[0.125], [], [-0.25, -0.25]]
    assert assign_credit(1.0, 3, intermediate=per_call) == [1.125, 1.0, 0.5]


def test_intermediate_rewards_as_a_mapping_are_weighted_and_added_after_discounting():
    # call 0: 0.5 * 2 + 0.5 * (-0.5) = 0.75; call 1: 2
    got = assign_credit(
        2.0, 2, mode="discounted", gamma=0.5, intermediate={0: [-0.5]}, intermediate_weight=0.5
    )
    assert got == [0.75, 2.0]


def test_empty_episode_has_no_returns():
    assert assign_credit(1.0, 0) == []


@pytest.mark.parametrize("gamma", [0.0, -0.1, 1.5, math.nan, math.inf])
def test_gamma_outside_zero_one_is_rejected(gamma):
    with pytest.raises(ValueError, match="gamma"):
        assign_credit(1.0, 2, mode="discounted", gamma=gamma)


@pytest.mark.parametrize("final_return", [math.nan, math.inf, -math.inf])
def test_non_finite_final_return_is_rejected(final_return):
    with pytest.raises(ValueError, match="final_return"):
        assign_credit(final_return, 2)


def test_bad_intermediate_rewards_are_rejected_with_context():
    with pytest.raises(ValueError, match="call index 3"):
        assign_credit(1.0, 3, intermediate={3: [0.1]})
    with pytest.raises(ValueError, match="2 entries for 3 calls"):
        assign_credit(1.0, 3, intermediate=[[0.1], [0.2]])
    with pytest.raises(ValueError, match="intermediate reward of call 1"):
        assign_credit(1.0, 2, intermediate={1: [math.nan]})
    with pytest.raises(ValueError, match="num_calls"):
        assign_credit(1.0, -1)


def test_unknown_credit_mode_lists_the_valid_ones():
    with pytest.raises(ValueError, match="identical"):
        assign_credit(1.0, 2, mode="monte_carlo")


# --- advantages -----------------------------------------------------------------------------------


def test_grpo_standardises_within_the_group():
    # mean 0.5, population std 0.5
    assert grpo([1.0, 0.0, 0.0, 1.0]) == pytest.approx([1.0, -1.0, -1.0, 1.0], rel=1e-5)
    # mean 2, population std sqrt(2/3): (3 - 2) / 0.8165 = 1.2247
    assert grpo([1.0, 2.0, 3.0]) == pytest.approx([-1.224744, 0.0, 1.224744], rel=1e-5)


def test_grpo_of_an_all_equal_group_is_exactly_zero():
    # 0.1 * 3 / 3 != 0.1 in floating point; the crumb must not be blown up by / (0 + eps).
    assert grpo([0.1, 0.1, 0.1]) == [0.0, 0.0, 0.0]


def test_rloo_subtracts_the_mean_of_the_others():
    # 1 - (0 + 0 + 1) / 3 = 2/3 ; 0 - (1 + 0 + 1) / 3 = -2/3
    assert rloo([1.0, 0.0, 0.0, 1.0]) == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    assert rloo([3.0, 1.0]) == [2.0, -2.0]
    assert rloo([5.0]) == [0.0]


def test_reinforce_baseline_and_plain_reinforce():
    assert reinforce_baseline([1.0, 2.0, 6.0]) == [-2.0, -1.0, 3.0]
    assert reinforce([0.5, -1.0]) == [0.5, -1.0]


def test_batch_baseline_centres_and_optionally_scales():
    assert batch_baseline([1.0, 3.0]) == [-1.0, 1.0]
    scaled = batch_baseline([2.0, 4.0, 6.0], normalize_std=True)
    assert scaled == pytest.approx([-1.224744, 0.0, 1.224744], rel=1e-5)


def test_normalize_whitens_and_handles_degenerate_batches():
    assert normalize([0.0, 10.0]) == pytest.approx([-1.0, 1.0], rel=1e-5)
    assert normalize([7.0, 7.0]) == [0.0, 0.0]
    assert normalize([]) == []


def test_estimators_reject_non_finite_returns():
    with pytest.raises(ValueError, match="#1"):
        grpo([1.0, math.nan])


# Two tasks with a real group each, a task with a single rollout, and two rollouts without a task.
MIXED_BATCH = [("a", 1.0), ("a", 0.0), (None, 3.0), ("b", 5.0), (None, 1.0), ("c", 2.0), ("c", 2.0)]


def test_group_advantages_with_rloo_pools_singletons_and_ungrouped_into_the_batch_baseline():
    # a: [1, -1]; c: [0, 0]; pool = [3 (None), 5 (b alone), 1 (None)] with mean 3 -> [0, 2, -2]
    assert group_advantages(MIXED_BATCH, "rloo") == [1.0, -1.0, 0.0, 2.0, -2.0, 0.0, 0.0]


def test_group_advantages_with_grpo_scales_the_pool_by_its_std_by_default():
    # pool [3, 5, 1]: mean 3, population std sqrt(8/3) = 1.63299
    expected = [1.0, -1.0, 0.0, 1.224744, -1.224744, 0.0, 0.0]
    assert group_advantages(MIXED_BATCH, "grpo") == pytest.approx(expected, rel=1e-5)
    assert group_advantages(MIXED_BATCH, "grpo", batch_std=False)[2:5] == [0.0, 2.0, -2.0]


def test_group_advantages_with_reinforce_ignores_groups():
    assert group_advantages(MIXED_BATCH, "reinforce") == [1.0, 0.0, 3.0, 5.0, 1.0, 2.0, 2.0]


def test_group_advantages_without_any_task_ids_is_the_batch_baseline():
    assert group_advantages([(None, 1.0), (None, 3.0)], "reinforce_baseline") == [-1.0, 1.0]
    assert group_advantages([], "grpo") == []


def test_group_advantages_rejects_unknown_estimators():
    with pytest.raises(ValueError, match="grpo"):
        group_advantages([("a", 1.0)], "ppo")


# --- AIR --------------------------------------------------------------------------------------------


def test_exact_match_normalises_case_space_and_trailing_punctuation():
    assert exact_match("  Paris. ", "paris") == 1.0
    assert exact_match("Paris", "London") == 0.0
    assert exact_match("Paris.", "Paris", normalize=False) == 0.0
    assert exact_match(None, "Paris") == 0.0


def test_last_number_reads_commas_signs_and_decimals():
    assert last_number("The answer is 1,234,567.") == 1234567.0
    assert last_number("x = -0.25 and y = -7.5") == -7.5
    assert last_number("pages 5-7") == 7.0
    assert last_number("#### 72") == 72.0
    assert last_number("no digits here") is None


def test_numeric_match_compares_the_last_number():
    assert numeric_match("so the total is $1,234.", 1234) == 1.0
    assert numeric_match("-3.50", "-3.5") == 1.0
    assert numeric_match("about 3.14159", 3.14, tol=0.01) == 1.0
    assert numeric_match("about 3.14159", 3.14) == 0.0
    assert numeric_match("2 apples, then 3", 2) == 0.0
    assert numeric_match("no idea", 1) == 0.0
    with pytest.raises(ValueError, match="no number"):
        numeric_match("7", "seven")


def test_contains_is_case_insensitive_by_default():
    assert contains("The capital is PARIS", "paris") == 1.0
    assert contains("The capital is Lyon", "paris") == 0.0
    assert contains("The capital is PARIS", "paris", normalize=False) == 0.0
    with pytest.raises(ValueError, match="non-empty"):
        contains("anything", "")


def test_json_valid_is_strict():
    assert json_valid('{"a": 1}') == 1.0
    assert json_valid(" [1, 2] ") == 1.0
    assert json_valid("{'a': 1}") == 0.0
    assert json_valid('{"a": NaN}') == 0.0
    assert json_valid("") == 0.0
    assert json_valid(None) == 0.0
