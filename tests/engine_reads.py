"""What the tests against the real engine read to prove a recorded id is the engine's own: the engine's
tokenization and detokenization, a rollout's recorded calls (each one ok), the end-of-turn token (in the ids,
never in the text) and how a prompt's ids continue its parent call."""
from __future__ import annotations

import requests

EOS = 2  # `<|im_end|>`: ends SmolLM2's turns; in `token_ids`, never in the text


def recorded_calls(proxy: str, rollout_id: str) -> list[dict]:
    response = requests.get(f"{proxy}/rollouts/{rollout_id}")
    assert response.status_code == 200, response.text
    calls = response.json()["calls"]
    # Every call here is answered in full, streams up to `data: [DONE]`, so each must be recorded as ok.
    assert [(call["status"], call["error"]) for call in calls] == [("ok", None)] * len(calls)
    return calls


def tokenize(engine_url: str, engine_model: str, **body) -> list[int]:
    """The engine's own tokenization: chat form (`messages`) or prompt form (`prompt`)."""
    response = requests.post(f"{engine_url}/tokenize", json={"model": engine_model, **body}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["tokens"]


def detokenize(engine_url: str, engine_model: str, ids: list[int]) -> str:
    response = requests.post(f"{engine_url}/detokenize", json={"model": engine_model, "tokens": ids}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["prompt"]


def without_eos(ids: list[int], finish_reason: str) -> list[int]:
    """The ids that make up the text: a turn that ended by itself (`stop`) ends with EOS, which has no text."""
    if finish_reason == "stop":
        assert ids[-1] == EOS, ids
        return ids[:-1]
    assert EOS not in ids, ids
    return ids


def link_kind(parent: dict, prompt_ids: list[int]) -> str:
    """How `prompt_ids` continue the parent call, computed from the ids alone."""
    head = parent["prompt_token_ids"]
    if prompt_ids[: len(head)] != head:
        return "diverged"
    tail = parent["completion_token_ids"]
    return "extends" if prompt_ids[len(head) : len(head) + len(tail)] == tail else "retokenized"
