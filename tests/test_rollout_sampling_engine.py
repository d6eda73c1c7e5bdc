"""What vLLM 0.32 does with the sampling edges the proxy and the trainer rely on, measured on the real engine (a few
tokens each): what it refuses, word for word as the stand-in engine refuses it (testkit/stub_sampling.py); a
temperature between 0 and 0.01 sampled at 0.01 (so the trainer scores it there: core/sampling_rules.py); a top_k
past the vocabulary sampled as none (trainer/truncation.py keeps the whole vocabulary too)."""
from __future__ import annotations

import pytest
import requests

from testkit.stub_sampling import sampling_refused

pytestmark = pytest.mark.engine


def complete(engine_url: str, engine_model: str, **fields) -> requests.Response:
    body = {"model": engine_model, "messages": [{"role": "user", "content": "Write one random word."}],
            "max_tokens": 12, "logprobs": True, "return_token_ids": True, "seed": 11, **fields}
    return requests.post(f"{engine_url}/v1/chat/completions", json=body, timeout=120)


def sampled(answer: requests.Response) -> tuple[list[int], list[float]]:
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    return choice["token_ids"], [entry["logprob"] for entry in choice["logprobs"]["content"]]


@pytest.mark.parametrize("fields", [{"top_p": 0}, {"temperature": 2.5}, {"temperature": -1}, {"top_k": -2},
                                    {"temperature": 0, "n": 2}])
def test_the_engine_refuses_what_the_stand_in_refuses_word_for_word(engine_url, engine_model, fields):
    answer = complete(engine_url, engine_model, **fields)
    assert answer.status_code == 400
    message, param = sampling_refused(fields)
    assert (answer.json()["error"]["message"], answer.json()["error"]["param"]) == (message, param)


def test_a_temperature_below_001_is_sampled_at_001_and_a_top_k_past_the_vocabulary_as_none(engine_url, engine_model):
    assert sampled(complete(engine_url, engine_model, temperature=0.005)) == \
        sampled(complete(engine_url, engine_model, temperature=0.01))
    assert sampled(complete(engine_url, engine_model, temperature=0.005)) != \
        sampled(complete(engine_url, engine_model, temperature=0.012))
    assert sampled(complete(engine_url, engine_model, top_k=10**6)) == sampled(complete(engine_url, engine_model))
