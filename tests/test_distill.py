"""On-policy distillation (trainer/distill.py): the teacher's gap is taken on the student's exact sampled ids, becomes
each sampled token's advantage, and reaches the PPO loss; the teacher context is shown to the teacher only."""
from __future__ import annotations

import asyncio
import math

import pytest

from core.settings import TrainingSettings
from core.settings.teacher import Teacher, Teachers
from trainer.distill import Distiller, TeacherReport, apply_gaps, policy_transitions
from trainer.logprobs import collate
from trainer.teacher_context import MISMATCH, teacher_prompt, with_context
from trainer.transitions import SkipReasons, Transition


def transition(completion, behaviour, advantage=0.0, mask=None, prompt=(5, 6, 7)) -> Transition:
    return Transition(list(prompt), list(completion), list(behaviour), advantage=advantage, loss_mask=mask,
                      call_ids=["call-1"])


def test_the_gap_of_each_sampled_token_is_its_advantage_clipped_and_weighted():
    settings = Teachers(teacher=("self",), teacher_coef=0.5, teacher_clip=2.0)
    # three sampled tokens and one of context between merged calls (mask 0: no gap, whatever the teacher says)
    t = transition([11, 12, 13, 14], [-1.0, -2.0, -0.5, 0.0], advantage=1.0, mask=[1, 1, 0, 1])
    report = TeacherReport("self")
    kept = apply_gaps([t], [[-0.5, -6.0, -9.0, -0.25]], settings, report)
    # gaps: +0.5, -4.0 -> clipped to -2.0, (context), -0.25; added to the reward's advantage 1.0 at coef 0.5
    assert kept == [t]
    assert t.token_advantages == [1.0 + 0.25, 1.0 - 1.0, 1.0, 1.0 - 0.125]
    assert report.tokens == 3 and report.scored == 1
    assert report.kl == pytest.approx((-0.5 + 4.0 + 0.25) / 3)  # reverse KL, unclipped: mean(student - teacher)
    assert report.clipped == pytest.approx(1 / 3)
    # and that is what the loss reads: the micro-batch's advantages on the scored positions
    mb = collate([t])
    assert mb.advantages[0, -4:].tolist() == [1.25, 0.0, 0.0, 0.875]  # context masked out of the loss


def test_only_drops_the_rewards_advantage_and_what_the_teacher_could_not_score():
    settings = Teachers(teacher=("self",), teacher_advantage="only")
    scored, unscored = transition([1, 2], [-1.0, -1.0], advantage=3.0), transition([3], [-1.0], advantage=3.0)
    report = TeacherReport("self")
    kept = apply_gaps([scored, unscored], [[-1.5, -0.5], None], settings, report)
    assert kept == [scored] and scored.token_advantages == [-0.5, 0.5]
    assert report.skipped == {"zero_advantage": 1}
    # added: the unscored one keeps its reward's advantage
    added = transition([3], [-1.0], advantage=3.0)
    assert apply_gaps([added], [None], Teachers(teacher=("self",)), TeacherReport("self")) == [added]
    assert added.token_advantages == [3.0]


def test_a_rollout_closed_without_reward_trains_only_a_taught_policy(tmp_path):
    from datetime import datetime, timezone

    from store.training import CallData, RolloutData

    def rollout(rid, reward):
        call = CallData(id=f"{rid}-c", seq=0, agent=None, policy_version=0, prompt_ids=[1, 2], prefix_kind=None,
                        choices=[([3, 4], [-0.5, -0.7])], policy="default")
        return RolloutData(rid, "task", reward, datetime.now(timezone.utc), [call])

    batch = [rollout("a", 1.0), rollout("b", 0.0), rollout("silent", None)]
    taught, untaught = SkipReasons(), SkipReasons()
    got = policy_transitions(batch, TrainingSettings(), 0, taught, taught=True, policy="default")
    assert sorted(t.rollout_id for t in got) == ["a", "b", "silent"]
    assert [t.advantages() for t in got if t.rollout_id == "silent"] == [[0.0, 0.0]]  # no reward: the teacher's
    got = policy_transitions(batch, TrainingSettings(), 0, untaught, taught=False, policy="default")
    assert sorted(t.rollout_id for t in got) == ["a", "b"]
    assert untaught["no_reward"] == 1 and untaught.decisions["silent-c"] == "no_reward"


@pytest.fixture(scope="module")
def tokenizer():
    transformers = pytest.importorskip("transformers")
    from engine.model import prepare_model

    return transformers.AutoTokenizer.from_pretrained(str(prepare_model()))


def test_the_context_is_rendered_by_the_template_and_the_completion_ids_stay_the_students(tokenizer):
    request = {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                          {"role": "user", "content": "What is 6*7?"}]}
    prompt = list(tokenizer.apply_chat_template(request["messages"], add_generation_prompt=True, tokenize=True,
                                                return_dict=False))
    context = "Worked example: 5*8 = 40."
    for at in ("system", "before_last_user"):
        shown = teacher_prompt(request, prompt, tokenizer, context, at)
        expected = list(tokenizer.apply_chat_template(with_context(request["messages"], context, at),
                                                      add_generation_prompt=True, tokenize=True, return_dict=False))
        assert shown == expected and shown != prompt
        assert context in tokenizer.decode(shown)
        assert tokenizer.decode(shown).endswith("What is 6*7?<|im_end|>\n<|im_start|>assistant\n")
    assert request["messages"][0]["content"] == "Be brief." and len(request["messages"]) == 2  # never edited
    assert teacher_prompt(request, prompt, tokenizer, None) == prompt  # no context: the student's own ids
    assert teacher_prompt(request, prompt[:-1], tokenizer, context) == MISMATCH  # ids the template did not render


def test_worked_examples_as_chat_turns_go_in_as_turns(tokenizer):
    import json

    opening = [{"role": "system", "content": "Use the calculator."}, {"role": "user", "content": "What is 6*7?"}]
    examples = [{"role": "user", "content": "What is 2*3?"}, {"role": "assistant", "content": "CALC: 2*3"}]
    context = json.dumps(examples)
    assert with_context(opening, context, "before_last_user") == [opening[0], *examples, opening[1]]
    assert with_context(opening, context, "system") == [opening[0], *examples, opening[1]]
    assert with_context(opening[1:], context, "system") == [*examples, opening[1]]
    assert with_context(opening, "[not json", "system")[0]["content"] == "Use the calculator.\n\n[not json"
    prompt = list(tokenizer.apply_chat_template(opening, add_generation_prompt=True, tokenize=True,
                                                return_dict=False))
    shown = tokenizer.decode(teacher_prompt({"messages": opening}, prompt, tokenizer, context, "before_last_user"))
    assert shown.index("What is 2*3?") < shown.index("CALC: 2*3") < shown.index("What is 6*7?")


def test_a_self_teacher_scores_the_exact_ids_with_the_adapter_off_and_its_gap_enters_the_step(tiny_model):
    from trainer.ppo import PolicyTrainer

    policy = PolicyTrainer(tiny_model, TrainingSettings(micro_batch_tokens=256, bf16=False, mini_batches=1))
    with_lora = [name for name, p in policy.model.named_parameters() if "lora_B" in name]
    for name, param in policy.model.named_parameters():  # an adapter that changes the policy, so the base differs
        if name in with_lora:
            param.data.normal_(0, 0.5)
    sampled = [transition([9, 10, 11], [-3.0, -3.0, -3.0]), transition([12, 13], [-4.0, -4.0], prompt=(5, 8))]
    base = policy.logprobs(sampled, adapter=False)
    assert base != policy.logprobs(sampled)  # the adapter matters, so "adapter off" is what is tested
    settings = Teachers(teacher=("self",), teacher_clip=50.0)
    distiller = Distiller(Teacher("default", "self"), settings)
    skips = SkipReasons()
    kept, report = asyncio.run(distiller.teach(sampled, {}, policy, skips))
    for t, teacher in zip(kept, base):
        assert t.token_advantages == pytest.approx([lp - b for lp, b in zip(teacher, t.behaviour_logprobs)])
    assert report.tokens == 5 and math.isfinite(report.kl)
    metrics = policy.step(kept)
    assert metrics.transitions == 2 and metrics.grad_norm > 0  # the gap is the gradient's only source here
