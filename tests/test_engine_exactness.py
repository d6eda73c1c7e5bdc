"""Exactness against the real engine: the `openai` SDK talks to `rlproxy serve` (a real process) in front of
the real vLLM serving SmolLM2-135M-Instruct, and the proxy records into real Postgres.

What is proved here is that every recorded id is the engine's own: prompt ids equal what vLLM's `/tokenize`
makes of the same request, completion ids decode to exactly the text the agent got (plus the end-of-turn
token), there is one logprob per completion token, and the agent receives the engine's bytes untouched.

Requests are greedy (temperature 0) wherever two answers are compared, and short, so the module stays
quick on a small CPU.
"""
from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import openai
import pytest
import requests

from tests.engine_reads import EOS, detokenize, link_kind, recorded_calls, tokenize, without_eos
from tests.support import running_proxy, wait_http

pytestmark = pytest.mark.engine

GREEDY = {"temperature": 0, "seed": 7}


# -- fixtures and helpers ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def proxy(engine_url: str, database_url: str, run_dir: Path) -> str:
    """One `rlproxy serve` for this module, in front of the shared real engine."""
    with running_proxy([engine_url], database_url, run_dir, "proxy-engine") as url:
        wait_http(url + "/readyz", timeout=60)  # the proxy has reached the engine
        yield url


def new_rollout(proxy: str) -> tuple[str, openai.OpenAI]:
    """A fresh rollout and an SDK client whose only change is its `base_url`."""
    response = requests.post(f"{proxy}/rollouts", json={"task_id": "exactness"})
    assert response.status_code == 201, response.text
    data = response.json()
    # No retries: a retried request would be a second recorded call.
    return data["rollout_id"], openai.OpenAI(base_url=data["base_url"], api_key="unused", max_retries=0,
                                             timeout=180)


# -- 1. chat -------------------------------------------------------------------------------------------
def test_chat_records_the_engines_own_token_ids(proxy, engine_url, engine_model):
    rollout_id, client = new_rollout(proxy)
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]

    completion = client.chat.completions.create(model=engine_model, messages=messages, max_tokens=16, **GREEDY)

    [call] = recorded_calls(proxy, rollout_id)
    prompt_ids, ids = call["prompt_token_ids"], call["completion_token_ids"]
    assert prompt_ids == tokenize(engine_url, engine_model, messages=messages, add_generation_prompt=True)
    choice = completion.choices[0]
    assert call["finish_reason"] == choice.finish_reason
    assert detokenize(engine_url, engine_model, without_eos(ids, choice.finish_reason)) == choice.message.content
    assert detokenize(engine_url, engine_model, [EOS]) == "<|im_end|>"
    assert len(call["completion_logprobs"]) == len(ids)
    assert all(isinstance(value, float) and value <= 0 for value in call["completion_logprobs"])
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (len(prompt_ids), len(ids))

    # The agent got the answer it asked for, without what the proxy added to the request.
    assert choice.logprobs is None
    assert getattr(choice, "token_ids", None) is None
    assert getattr(completion, "prompt_token_ids", None) is None
    assert call["request"] == {"model": engine_model, "messages": messages, "max_tokens": 16, **GREEDY}


# -- 2. streaming and non-streaming --------------------------------------------------------------------
def test_streaming_records_the_same_ids_and_logprobs_as_non_streaming(proxy, engine_model):
    rollout_id, client = new_rollout(proxy)
    request = {"model": engine_model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8,
               **GREEDY}

    whole = client.chat.completions.create(**request)
    chunks = list(client.chat.completions.create(**request, stream=True))
    streamed_text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)

    assert streamed_text == whole.choices[0].message.content
    assert all(chunk.choices[0].logprobs is None for chunk in chunks if chunk.choices)
    plain, streamed = recorded_calls(proxy, rollout_id)
    assert streamed["stream"] and not plain["stream"]
    assert streamed["prompt_token_ids"] == plain["prompt_token_ids"]
    assert streamed["completion_token_ids"] == plain["completion_token_ids"]
    assert len(streamed["completion_logprobs"]) == len(streamed["completion_token_ids"])
    # The second prompt comes from the prefix cache, so logprobs may differ in the last digits.
    assert streamed["completion_logprobs"] == pytest.approx(plain["completion_logprobs"], abs=1e-3)
    assert streamed["finish_reason"] == plain["finish_reason"] == whole.choices[0].finish_reason
    assert streamed["response"]["choices"][0]["message"]["content"] == streamed_text


# -- 3. completions ------------------------------------------------------------------------------------
def test_completions_record_the_prompt_as_the_engine_tokenizes_it(proxy, engine_url, engine_model):
    rollout_id, client = new_rollout(proxy)
    prompt = "The capital of France is"
    # /v1/completions and /tokenize both default to add_special_tokens=true (no chat template either way).
    expected_prompt = tokenize(engine_url, engine_model, prompt=prompt, add_special_tokens=True)

    whole = client.completions.create(model=engine_model, prompt=prompt, max_tokens=8, **GREEDY)
    chunks = list(client.completions.create(model=engine_model, prompt=prompt, max_tokens=8, stream=True, **GREEDY))
    streamed_text = "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)

    assert whole.choices[0].logprobs is None and all(chunk.choices[0].logprobs is None for chunk in chunks)
    assert streamed_text == whole.choices[0].text
    for call in recorded_calls(proxy, rollout_id):
        assert call["route"] == "completions"
        assert call["prompt_token_ids"] == expected_prompt
        ids = call["completion_token_ids"]
        assert len(ids) == len(call["completion_logprobs"]) > 0
        assert detokenize(engine_url, engine_model, without_eos(ids, call["finish_reason"])) == streamed_text


# -- 4. tools ------------------------------------------------------------------------------------------
CALCULATE = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]},
    },
}
TOOL_SYSTEM = ("You can use a calculator. To call it, answer with exactly\n<tool_call>\n"
               '{"name": "calculate", "arguments": {"expression": "2+2"}}\n</tool_call>')


def test_a_tool_result_turn_is_recorded_as_the_template_renders_it(proxy, engine_url, engine_model):
    rollout_id, client = new_rollout(proxy)
    # The second turn of a tool round trip, as an agent sends it back after running the tool.
    messages = [
        {"role": "system", "content": TOOL_SYSTEM},
        {"role": "user", "content": "What is 6 times 7?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_6x7", "type": "function",
             "function": {"name": "calculate", "arguments": json.dumps({"expression": "6*7"})}},
        ]},
        {"role": "tool", "tool_call_id": "call_6x7", "content": "42"},
    ]

    answer = client.chat.completions.create(model=engine_model, messages=messages, tools=[CALCULATE],
                                            max_tokens=12, **GREEDY)

    [call] = recorded_calls(proxy, rollout_id)
    assert call["request"]["messages"] == messages and call["request"]["tools"] == [CALCULATE]
    expected = tokenize(engine_url, engine_model, messages=messages, tools=[CALCULATE], add_generation_prompt=True)
    assert call["prompt_token_ids"] == expected
    rendered = detokenize(engine_url, engine_model, expected)
    assert "<|im_start|>tool\n42<|im_end|>" in rendered and rendered.endswith("<|im_start|>assistant\n")
    # SmolLM2's template has no tool-call syntax: the assistant turn above renders empty. The ids are still
    # exactly what the engine computed on.

    # A normal answer: text, no tool call, ids that decode to it.
    message = answer.choices[0].message
    assert not message.tool_calls and message.content
    assert answer.choices[0].finish_reason in ("stop", "length")
    ids = call["completion_token_ids"]
    assert len(ids) == len(call["completion_logprobs"])
    assert detokenize(engine_url, engine_model, without_eos(ids, call["finish_reason"])) == message.content


# -- 5. multi-turn -------------------------------------------------------------------------------------
def test_the_recorded_prefix_link_is_what_the_ids_show(proxy, engine_url, engine_model):
    rollout_id, client = new_rollout(proxy)
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    first = client.chat.completions.create(model=engine_model, messages=messages, max_tokens=24, **GREEDY)
    assert first.choices[0].finish_reason == "stop"  # the turn ended with EOS, as the template renders it
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And of Germany?"}]
    client.chat.completions.create(model=engine_model, messages=messages, max_tokens=8, **GREEDY)

    one, two = recorded_calls(proxy, rollout_id)
    assert one["prefix_kind"] == "first"
    assert two["prompt_token_ids"] == tokenize(engine_url, engine_model, messages=messages,
                                               add_generation_prompt=True)
    # The link the proxy recorded is the one the ids show...
    assert two["prefix_kind"] == link_kind(one, two["prompt_token_ids"])
    assert two["prefix_parent_id"] == one["call_id"]
    # ...and for a turn that ended with EOS, sent back verbatim, that is an exact extension.
    assert two["prefix_kind"] == "extends"
    head = one["prompt_token_ids"] + one["completion_token_ids"]
    assert two["prompt_token_ids"][: len(head)] == head


# -- 6. byte transparency ------------------------------------------------------------------------------
def _normalise(body: bytes) -> bytes:
    """Every engine answer has its own id and timestamp; nothing else may differ."""
    body = re.sub(rb'"id":"(chatcmpl|cmpl)-[0-9a-f]+"', b'"id":"ID"', body)
    return re.sub(rb'"created":\d+', b'"created":0', body)


FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.mark.parametrize("route,payload", [
    pytest.param("chat/completions", {"messages": FRANCE}, id="chat"),
    pytest.param("chat/completions", {"messages": FRANCE, "stream": True}, id="chat-stream"),
    pytest.param("completions", {"prompt": "The capital of France is"}, id="completions"),
    pytest.param("completions", {"prompt": "The capital of France is", "stream": True}, id="completions-stream"),
    # Tokens that end inside a multi-byte character: asked for token ids, vLLM streams a `"delta":{}` chunk
    # for each of them, which it does not send when nobody asked; the proxy must not relay those.
    pytest.param("chat/completions", {"messages": [{"role": "user", "content": "Repeat exactly: 日本語 🙂 café"}],
                                      "stream": True}, id="chat-stream-partial-utf8"),
    # The agent asked for logprobs itself: the engine's own float formatting (e.g. -5.2e-06) must survive.
    pytest.param("completions", {"prompt": "<|im_start|>user\nhi<|im_end|>", "logprobs": 0},
                 id="completions-own-logprobs"),
])
def test_the_agent_receives_the_engines_bytes(proxy, engine_url, engine_model, route, payload):
    body = {"model": engine_model, "max_tokens": 12, **GREEDY, **payload}
    # A busy engine may put several tokens into one stream chunk (vLLM coalesces what its detokenizer has ready):
    # two generations' chunking then differs though each agent got its engine's bytes. One pair of the three
    # tries must agree byte for byte.
    for _ in range(3):
        direct = requests.post(f"{engine_url}/v1/{route}", json=body, timeout=180)
        proxied = requests.post(f"{proxy}/rollouts/{uuid.uuid4().hex}/v1/{route}", json=body, timeout=180)
        if not payload.get("stream") or _normalise(proxied.content) == _normalise(direct.content):
            break

    assert proxied.status_code == direct.status_code == 200
    assert proxied.headers["content-type"].split(";")[0] == direct.headers["content-type"].split(";")[0]
    if "logprobs" in payload and not re.search(rb"\de-0\d", direct.content):
        pytest.skip("no logprob below 1e-4 in this engine's answer")
    assert _normalise(proxied.content) == _normalise(direct.content)
    if payload.get("stream"):
        assert proxied.content.endswith(b"data: [DONE]\n\n")


# -- 7. n > 1 ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_each_of_n_choices_is_recorded_with_its_own_ids(proxy, engine_model, stream):
    rollout_id, client = new_rollout(proxy)
    request = {"model": engine_model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8,
               "n": 2, "temperature": 1, "seed": 3}
    if stream:
        chunks = list(client.chat.completions.create(**request, stream=True, stream_options={"include_usage": True}))
        usage = chunks[-1].usage
        texts = {0: "", 1: ""}
        for chunk in chunks:
            for choice in chunk.choices:
                assert choice.logprobs is None
                texts[choice.index] += choice.delta.content or ""
    else:
        completion = client.chat.completions.create(**request)
        usage = completion.usage
        texts = {choice.index: choice.message.content for choice in completion.choices}
        assert all(choice.logprobs is None for choice in completion.choices)

    [call] = recorded_calls(proxy, rollout_id)
    choices = call["choices"]
    assert [choice["index"] for choice in choices] == [0, 1]
    for choice in choices:
        assert len(choice["token_ids"]) == len(choice["logprobs"]) > 0
        assert call["response"]["choices"][choice["index"]]["message"]["content"] == texts[choice["index"]]
    assert choices[0]["token_ids"] != choices[1]["token_ids"]  # two samples, not one recorded twice
    assert call["completion_token_ids"] == choices[0]["token_ids"]
    assert usage.completion_tokens == sum(len(choice["token_ids"]) for choice in choices)
    assert usage.prompt_tokens == len(call["prompt_token_ids"])
