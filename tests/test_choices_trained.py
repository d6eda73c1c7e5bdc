"""A call answered with several choices (`n` > 1): the outcome followed from the one the agent went on from, so
that one is trained; the others were not part of what earned the reward. Pure (no torch, no database)."""
from __future__ import annotations

from core.settings import TrainingSettings
from store.models import utcnow
from store.training import CallData, RolloutData
from trainer.batch import build_transitions
from trainer.transitions import SkipReasons

NOW = utcnow()
PROMPT = [5, 6, 7]
CHOICES = [([10, 11, 2], [-1.0, -1.1, -1.2]), ([20, 21, 2], [-2.0, -2.1, -2.2]), ([30, 31, 2], [-3.0, -3.1, -3.2])]


def episode(name: str, reward: float, next_prompt: list[int] | None, kind: str = "retokenized") -> RolloutData:
    """A three-choice call, then (unless `next_prompt` is None) the agent's next call."""
    calls = [CallData(f"{name}-pick", 0, "solver", 3, PROMPT, "first", list(CHOICES), started_at=NOW)]
    if next_prompt is not None:
        calls.append(CallData(f"{name}-next", 1, "solver", 3, next_prompt, kind, [([40, 2], [-0.5, -0.5])],
                              started_at=NOW))
    return RolloutData(name, "t", reward, NOW, calls)


def trained(batch: list[RolloutData], keep_zero: bool = False, **settings) -> tuple[list, SkipReasons]:
    skips = SkipReasons()
    return build_transitions(batch, TrainingSettings(**settings), 3, skips, keep_zero=keep_zero), skips


def test_only_the_choice_the_next_call_went_on_from_is_trained_and_the_two_calls_merge():
    """The agent took the second choice (index 1) into its next turn: one transition, that choice's tokens
    trained with their own log-probs, then the next call's."""
    win = episode("win", 1.0, PROMPT + [20, 21, 2] + [99] + [12])
    lose = episode("lose", 0.0, PROMPT + [30, 31, 2] + [99] + [12])
    transitions, skips = trained([win, lose])
    by_rollout = {t.rollout_id: t for t in transitions}
    assert set(by_rollout) == {"win", "lose"} and not skips
    merged = by_rollout["win"]
    assert merged.prompt_ids == PROMPT
    trained_tokens = [token for token, mask in zip(merged.completion_ids, merged.loss_mask) if mask]
    assert trained_tokens == [20, 21, 2, 40, 2]  # choice 1, then the next call's answer; no other choice
    assert [lp for lp, mask in zip(merged.behaviour_logprobs, merged.loss_mask) if mask] == [-2.0, -2.1, -2.2, -0.5, -0.5]
    assert 30 not in merged.completion_ids and 10 not in merged.completion_ids


def test_a_choice_continued_as_the_first_one_merges_as_the_store_linked_it():
    win = episode("win", 1.0, PROMPT + [10, 11, 2, 12], kind="extends")
    lose = episode("lose", 0.0, PROMPT + [10, 11, 2, 13], kind="extends")
    transitions, _ = trained([win, lose])
    assert len(transitions) == 2
    assert all([t for t, m in zip(x.completion_ids, x.loss_mask) if m][:3] == [10, 11, 2] for x in transitions)


def test_a_final_pick_among_choices_says_nothing_about_which_earned_the_reward_and_is_skipped():
    """A best-of-n agent answered with whichever choice its own check liked: no later call shows which, so
    training all three with the rollout's advantage would reward the two it threw away."""
    transitions, skips = trained([episode("a", 1.0, None), episode("b", 0.0, None)])
    assert transitions == []
    assert skips == {"choice_not_continued": 2}


def test_a_next_call_that_does_not_extend_the_prompt_leaves_the_choice_unknown():
    transitions, skips = trained([episode("a", 1.0, [1, 2, 3], kind="diverged"),
                                  episode("b", 0.0, [1, 2, 4], kind="diverged")])
    assert sorted(t.call_id for t in transitions) == ["a-next", "b-next"]
    assert skips == {"choice_not_continued": 2}


def test_choices_trained_all_keeps_every_choice_for_a_vote_over_them():
    transitions, skips = trained([episode("a", 1.0, None), episode("b", 0.0, None)], choices_trained="all")
    assert len(transitions) == 6 and not skips
    assert {tuple(t.completion_ids) for t in transitions} == {tuple(tokens) for tokens, _ in CHOICES}


def test_a_choice_cut_short_that_starts_another_is_not_taken_for_the_longer_one_the_agent_went_on_from():
    """Choice 0 stopped on a stop string after two tokens (no end-of-turn token); choice 1 began with the same two
    tokens and went on. The agent continued choice 1: its prompt holds [10, 11] too, but only as the start of it,
    and taking choice 0 would leave 12 and the end-of-turn token, sampled too, as untrained context."""
    choices = [([10, 11], [-1.0, -1.1]), ([10, 11, 12, 2], [-1.0, -1.1, -2.2, -2.3])]
    calls = [CallData("pick", 0, "solver", 3, PROMPT, "first", choices, started_at=NOW),
             CallData("next", 1, "solver", 3, PROMPT + [10, 11, 12, 2, 99], "retokenized", [([40, 2], [-0.5, -0.5])],
                      started_at=NOW)]
    transitions, skips = trained([RolloutData("r", None, 1.0, NOW, calls)], keep_zero=True)
    [merged] = transitions
    sampled = [(token, lp) for token, lp, mask in zip(merged.completion_ids, merged.behaviour_logprobs,
                                                       merged.loss_mask) if mask]
    assert sampled == [(10, -1.0), (11, -1.1), (12, -2.2), (2, -2.3), (40, -0.5), (2, -0.5)]
    assert not skips


def test_a_choice_continued_after_another_conversations_call_is_still_found():
    """One agent name, two conversations at once: the three-choice call's continuation comes after a call of the
    other conversation, whose prompt does not extend it."""
    calls = [CallData("pick", 0, "solver", 3, PROMPT, "first", list(CHOICES), started_at=NOW),
             CallData("other", 1, "solver", 3, [8, 9], "diverged", [([50, 2], [-0.7, -0.7])], started_at=NOW),
             CallData("next", 2, "solver", 3, PROMPT + [20, 21, 2, 99], "diverged", [([40, 2], [-0.5, -0.5])],
                      started_at=NOW)]
    transitions, skips = trained([RolloutData("r", None, 1.0, NOW, calls)], keep_zero=True)
    picked = next(t for t in transitions if t.call_ids == ["pick"])
    assert picked.completion_ids == [20, 21, 2] and picked.behaviour_logprobs == [-2.0, -2.1, -2.2]
    assert sorted(t.call_id for t in transitions) == ["next", "other", "pick"] and not skips
