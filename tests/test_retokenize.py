"""The exact-capture ablation: what the trainer sees when it re-tokenizes recorded text (trainer/retokenize.py),
with the bundled model's real tokenizer."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from store.models import PrefixKind
from store.training import CallData, RolloutData
from trainer.retokenize import retokenize

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tokenizer():
    from engine.model import prepare_model

    return transformers.AutoTokenizer.from_pretrained(str(prepare_model()))


def episode(tokenizer, first_reply_ids: list[int]):
    """Two calls as the proxy records them: the second call's messages carry the first reply verbatim."""
    question = [{"role": "user", "content": "What is 23 * 41?"}]
    first_text = tokenizer.decode(first_reply_ids)
    second = question + [{"role": "assistant", "content": first_text}, {"role": "user", "content": "RESULT: 943"}]
    prompt_1 = tokenizer.apply_chat_template(question, add_generation_prompt=True, tokenize=True, return_dict=False)
    prompt_2 = tokenizer.apply_chat_template(second, add_generation_prompt=True, tokenize=True, return_dict=False)
    answer = tokenizer.encode("ANSWER: 943", add_special_tokens=False) + [tokenizer.eos_token_id]
    calls = [CallData("c1", 0, "demo", 0, list(prompt_1), PrefixKind.FIRST,
                      [(first_reply_ids + [tokenizer.eos_token_id], [-0.5] * (len(first_reply_ids) + 1))]),
             CallData("c2", 1, "demo", 0, list(prompt_2), PrefixKind.EXTENDS, [(answer, [-0.1] * len(answer))])]
    texts = {"c1": ({"messages": question}, {"choices": [{"message": {"content": first_text}, "finish_reason": "stop"}]}),
             "c2": ({"messages": second}, {"choices": [{"message": {"content": "ANSWER: 943"},
                                                        "finish_reason": "stop"}]})}
    rollout = RolloutData("r1", "t", 1.0, datetime.now(timezone.utc), calls, "demo")
    return rollout, texts


def test_text_the_tokenizer_reads_back_the_same_way_changes_nothing_but_the_logprobs(tokenizer):
    reply = tokenizer.encode("CALC: 23 * 41", add_special_tokens=False)
    rollout, texts = episode(tokenizer, reply)
    recorded = [(c.prompt_ids, c.choices[0][0]) for c in rollout.calls]

    assert retokenize([rollout], texts, tokenizer) == 0
    assert [(c.prompt_ids, c.choices[0][0]) for c in rollout.calls] == recorded
    assert all(lp == 0.0 for c in rollout.calls for lp in c.choices[0][1])  # to be recomputed by the trainer
    assert [c.prefix_kind for c in rollout.calls] == [PrefixKind.FIRST, PrefixKind.EXTENDS]


def test_a_sampled_split_the_tokenizer_would_not_make_is_lost(tokenizer):
    # The model may sample "CALC" as single characters; the text is the same, the tokens are not.
    reply = [t for ch in "CALC" for t in tokenizer.encode(ch, add_special_tokens=False)]
    reply += tokenizer.encode(": 23 * 41", add_special_tokens=False)
    assert tokenizer.decode(reply) == "CALC: 23 * 41"
    rollout, texts = episode(tokenizer, reply)
    sampled = list(rollout.calls[0].choices[0][0])

    assert retokenize([rollout], texts, tokenizer) >= 1
    assert rollout.calls[0].choices[0][0] != sampled  # what the model produced is no longer what is trained


def test_calls_without_recorded_text_lose_their_ids(tokenizer):
    rollout, texts = episode(tokenizer, tokenizer.encode("CALC: 23 * 41", add_special_tokens=False))
    del texts["c1"]  # e.g. stored with redaction
    retokenize([rollout], texts, tokenizer)
    assert rollout.calls[0].prompt_ids is None and rollout.calls[0].choices == []
    assert rollout.calls[1].prefix_kind == PrefixKind.FIRST  # nothing left to extend
