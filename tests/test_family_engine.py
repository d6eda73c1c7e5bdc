"""Other model families through the real engine: a tiny random Qwen3 and Llama 3 (testkit/model_kit: their
real vocabularies, this project's templates of each family) served by vLLM with the parsers `rlproxy engine`
picks from the folder (engine/families.py), `rlproxy serve` in front, the SDKs pointed at it by `base_url` only.

For each family, streamed and not, on Chat Completions, Responses and Messages: the recorded prompt and
completion ids are the engine's own (its `return_token_ids` for the same greedy request, or `/tokenize` where a
route reports none), a stream records the ids of the whole answer, and what the agent receives is what the
engine parsed: the family's tool calls (Qwen3's `<tool_call>` blocks, Llama 3's bare JSON) and Qwen3's reasoning,
recorded where the web view reads them (proxy/ui/turns.js shows `message.reasoning`).

Random weights write no tool call of their own, so the cases that need one force the text with a regular
expression (vLLM's `structured_outputs`, with Qwen3's thinking off: the grammar writes `<tool_call>` out of
ordinary tokens, which the hermes parser reads as text, while the qwen3 reasoning parser looks for the `</think>`
token itself, so without a think block in the prompt a stream would report all of it as reasoning); reasoning is
sampled with a seed and a bias on `</think>`, so that the id comes up after a few tokens. The parsers and the
ids are the engine's all the same. One engine start per family (module scope);
`RLPROXY_TEST_FAMILY_ENGINES="qwen3=http://...,llama3=http://..."` uses engines already running (`rlproxy engine
--model FOLDER` on the kit's folder).
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from tests.engine_dialects import anthropic_client, native, openai_client, serving_proxy, sse_events
from tests.engine_fixture import small_engine_settings

pytestmark = pytest.mark.engine

URLS_ENV = "RLPROXY_TEST_FAMILY_ENGINES"
# CI's two; `RLPROXY_TEST_FAMILIES=mistral` runs the same checks on another family (docs/deploy.md, Model families)
FAMILIES_IN_CI = os.environ.get("RLPROXY_TEST_FAMILIES", "qwen3,llama3").split(",")
THINK_START, THINK_END = 151667, 151668  # Qwen3's <think> and </think>
GREEDY = {"temperature": 0}
CALC = {"type": "function", "function": {"name": "calc", "description": "Evaluate an arithmetic expression.",
                                         "parameters": {"type": "object", "properties": {"expr": {"type": "string"}},
                                                        "required": ["expr"]}}}
QUESTION = [{"role": "user", "content": "What is 17*23?"}]
# The text each family's template teaches for a call (testkit/model_kit/templates.py), and what it parses to.
CALL_TEXT = {"qwen3": '<tool_call>\n{"name": "calc", "arguments": {"expr": "17*23"}}\n</tool_call>',
             "llama3": '{"name": "calc", "parameters": {"expr": "17*23"}}',
             "mistral": '[TOOL_CALLS][{"name": "calc", "arguments": {"expr": "17*23"}}]'}
ARGUMENTS = {"expr": "17*23"}
# the ids a turn may end with (generation_config.json): <|im_end|>, <|endoftext|>; <|eot_id|>, <|eom_id|>, <|end_of_text|>
END = {"qwen3": {151645, 151643}, "llama3": {128009, 128008, 128001}, "mistral": {2}}


@dataclass(frozen=True)
class Served:
    family: str
    engine_url: str
    model: str
    proxy: str

    def template_kwargs(self) -> dict:
        """Qwen3 with its thinking off (the prompt ends in an empty think block), other families as they are."""
        return {"chat_template_kwargs": {"enable_thinking": False}} if self.family == "qwen3" else {}

    def forced(self, text: str) -> dict:
        """Request fields that make the engine write exactly `text` (then the end of the turn)."""
        return {"structured_outputs": {"regex": re.escape(text)}, **self.template_kwargs()}


def _external(family: str) -> str | None:
    pairs = dict(item.split("=", 1) for item in os.environ.get(URLS_ENV, "").split(",") if "=" in item)
    return pairs.get(family)


@pytest.fixture(scope="module", params=FAMILIES_IN_CI)
def served(request, family_model, database_url: str, run_dir: Path) -> Iterator[Served]:
    """The family's tiny model on its own engine (one at a time: the module's tests run family by family)."""
    family = request.param
    url = _external(family)
    engine = None
    if url is None:
        from engine.local import Engine, vllm_available

        if not vllm_available():
            pytest.skip("vLLM is not installed (pip install -e '.[engine]')")
        folder = family_model(family)
        settings = small_engine_settings().model_copy(update={"model": folder})
        engine = Engine(settings, model_path=folder)
        engine.start()
        try:
            engine.wait_ready()
        except BaseException:
            engine.stop()
            raise
        url = engine.base_url
    try:
        model = requests.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
        with serving_proxy(url, database_url, run_dir, f"proxy-{family}") as proxy:
            yield Served(family, url, model, proxy)
    finally:
        if engine is not None:
            engine.stop()


def recorded(proxy: str, rollout_id: str) -> list[dict]:
    calls = requests.get(f"{proxy}/rollouts/{rollout_id}", timeout=30).json()["calls"]
    assert [(call["status"], call["error"]) for call in calls] == [("ok", None)] * len(calls)
    return calls


def engine_chat(served: Served, body: dict) -> dict:
    """The engine's own answer and ids for a chat request, asked directly."""
    return native(served.engine_url, "/v1/chat/completions", {**body, "return_token_ids": True})


def tokenize(served: Served, **body) -> list[int]:
    response = requests.post(f"{served.engine_url}/tokenize", json={"model": served.model, **body}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["tokens"]


# -- chat: the family's tool calls ----------------------------------------------------------------------
def test_chat_tool_calls_are_parsed_as_the_family_writes_them_and_recorded_with_the_engines_ids(served):
    rollout_id, client = openai_client(served.proxy)
    request = {"model": served.model, "messages": QUESTION, "tools": [CALC], "max_tokens": 80, **GREEDY}
    forced = served.forced(CALL_TEXT[served.family])

    whole = client.chat.completions.create(**request, extra_body=forced)
    chunks = list(client.chat.completions.create(**request, extra_body=forced, stream=True))
    own = engine_chat(served, {**request, **forced})

    [call] = whole.choices[0].message.tool_calls
    assert call.function.name == "calc" and json.loads(call.function.arguments) == ARGUMENTS
    assert whole.choices[0].finish_reason == "tool_calls" and not whole.choices[0].message.content
    streamed = [d for chunk in chunks if chunk.choices for d in chunk.choices[0].delta.tool_calls or []]
    assert streamed[0].function.name == "calc"
    assert json.loads("".join(d.function.arguments or "" for d in streamed)) == ARGUMENTS

    plain, stream = recorded(served.proxy, rollout_id)
    assert plain["prompt_token_ids"] == stream["prompt_token_ids"] == own["prompt_token_ids"]
    assert plain["prompt_token_ids"] == tokenize(served, messages=QUESTION, tools=[CALC], add_generation_prompt=True,
                                                 **served.template_kwargs())
    assert plain["completion_token_ids"] == stream["completion_token_ids"] == own["choices"][0]["token_ids"]
    assert plain["completion_token_ids"][-1] in END[served.family]
    assert len(plain["completion_logprobs"]) == len(plain["completion_token_ids"])
    for record in (plain, stream):  # the parser's output, where the web view reads it
        [tool_call] = record["response"]["choices"][0]["message"]["tool_calls"]
        assert tool_call["function"]["name"] == "calc"
        assert json.loads(tool_call["function"]["arguments"]) == ARGUMENTS


def test_the_next_turn_re_renders_the_call_and_is_recorded_as_the_engine_tokenizes_it(served):
    """The call the engine sampled comes back in the history, rendered by the template: its ids need not be the
    sampled ones (the trainer's merge decides what to do with that: docs/training.md)."""
    rollout_id, client = openai_client(served.proxy)
    first = client.chat.completions.create(model=served.model, messages=QUESTION, tools=[CALC], max_tokens=80,
                                           extra_body=served.forced(CALL_TEXT[served.family]), **GREEDY)
    call = first.choices[0].message.tool_calls[0]
    history = QUESTION + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                          {"role": "tool", "tool_call_id": call.id, "content": "391"}]
    thinking_off = served.template_kwargs()
    client.chat.completions.create(model=served.model, messages=history, tools=[CALC], max_tokens=4,
                                   extra_body=thinking_off, **GREEDY)

    one, two = recorded(served.proxy, rollout_id)
    assert two["prompt_token_ids"] == tokenize(served, messages=history, tools=[CALC], add_generation_prompt=True,
                                               **thinking_off)
    head = one["prompt_token_ids"]
    if served.family == "qwen3":  # the empty think block that ended the first prompt is not in the history
        assert head[-4:] == [THINK_START, 271, THINK_END, 271] and two["prompt_token_ids"][:len(head)] != head
        head = head[:-4]
    assert two["prompt_token_ids"][:len(head)] == head  # the history before the call is shared
    sampled = one["completion_token_ids"][:-1]  # the call as the engine wrote it, without the end token
    assert two["prompt_token_ids"][len(head):len(head) + len(sampled)] != sampled  # re-tokenized by the template
    rendered = requests.post(f"{served.engine_url}/detokenize", timeout=60, json={
        "model": served.model, "tokens": two["prompt_token_ids"][len(head):]}).json()["prompt"]
    assert '"name": "calc"' in rendered and '"17*23"' in rendered and "391" in rendered


# -- chat: Qwen3's reasoning ----------------------------------------------------------------------------
def test_reasoning_is_parsed_where_the_family_has_it_streamed_or_not(served):
    rollout_id, client = openai_client(served.proxy)
    if served.family != "qwen3":  # no reasoning parser (engine/families.py): the whole answer is content
        whole = client.chat.completions.create(model=served.model, messages=QUESTION, max_tokens=6, **GREEDY)
        own = engine_chat(served, {"model": served.model, "messages": QUESTION, "max_tokens": 6, **GREEDY})
        assert whole.choices[0].message.model_dump().get("reasoning") is None
        assert whole.choices[0].message.content == own["choices"][0]["message"]["content"]
        [call] = recorded(served.proxy, rollout_id)
        assert call["completion_token_ids"] == own["choices"][0]["token_ids"]
        return
    # sampled, seeded: </think> has about one chance in seven a token, so it ends the reasoning early
    request = {"model": served.model, "messages": QUESTION, "max_tokens": 24, "temperature": 1.0, "seed": 3,
               "logit_bias": {str(THINK_END): 10}}

    whole = client.chat.completions.create(**request)
    chunks = list(client.chat.completions.create(**request, stream=True))
    own = engine_chat(served, request)

    ids = own["choices"][0]["token_ids"]
    assert THINK_END in ids, ids
    reasoning = whole.choices[0].message.model_dump()["reasoning"]
    assert reasoning and reasoning == own["choices"][0]["message"]["reasoning"]
    assert reasoning == requests.post(f"{served.engine_url}/detokenize", timeout=60, json={
        "model": served.model, "tokens": ids[:ids.index(THINK_END)]}).json()["prompt"]
    streamed = "".join(getattr(c.choices[0].delta, "reasoning", None) or "" for c in chunks if c.choices)
    assert streamed == reasoning
    plain, stream = recorded(served.proxy, rollout_id)
    assert plain["completion_token_ids"] == stream["completion_token_ids"] == ids
    for record in (plain, stream):  # where the web view reads it (proxy/ui/turns.js)
        assert record["response"]["choices"][0]["message"]["reasoning"] == reasoning


# -- Responses and Messages ------------------------------------------------------------------------------
def test_responses_record_the_ids_of_the_engines_own_route_streamed_or_not(served):
    rollout_id, client = openai_client(served.proxy)
    request = {"model": served.model, "input": "What is 17*23?", "max_output_tokens": 8, **GREEDY}

    whole = client.responses.create(**request)
    # a random model is cut off by max_output_tokens: that stream ends in response.incomplete, which the SDK's
    # stream helper does not accept as an end, so the events are read as they come
    events = list(client.responses.create(**request, stream=True))
    own = native(served.engine_url, "/v1/responses", {**request, "enable_response_messages": True})

    plain, streamed = recorded(served.proxy, rollout_id)
    [own_input], [own_output] = own["input_messages"], own["output_messages"]
    assert plain["prompt_token_ids"] == streamed["prompt_token_ids"] == own_input["tokens"]
    assert plain["completion_token_ids"] == streamed["completion_token_ids"] == own_output["tokens"]
    final = events[-1].response
    assert events[-1].type == f"response.{whole.status}" and final.status == whole.status == own["status"]
    assert [item.type for item in whole.output] == [item.type for item in final.output] == [
        item["type"] for item in own["output"]]  # Qwen3's reasoning item too
    assert whole.output_text == final.output_text
    assert whole.usage.output_tokens == len(plain["completion_token_ids"])


def test_messages_record_the_prompt_as_the_engine_tokenizes_it_streamed_or_not(served):
    rollout_id, client = anthropic_client(served.proxy)
    request = {"model": served.model, "max_tokens": 8, "messages": QUESTION, "extra_body": GREEDY}

    whole = client.messages.create(**request)
    with client.messages.stream(**request) as stream:
        text = "".join(stream.text_stream)
    own = native(served.engine_url, "/v1/messages", {k: v for k, v in request.items() if k != "extra_body"} | GREEDY)

    plain, streamed = recorded(served.proxy, rollout_id)
    assert plain["prompt_token_ids"] == streamed["prompt_token_ids"] == tokenize(
        served, messages=QUESTION, add_generation_prompt=True)
    assert plain["completion_token_ids"] == streamed["completion_token_ids"]
    assert own["usage"]["input_tokens"] == len(plain["prompt_token_ids"])
    assert "".join(block.text for block in whole.content if block.type == "text") == text
    wire = sse_events(f"{served.engine_url}/v1/messages", {k: v for k, v in request.items() if k != "extra_body"}
                      | GREEDY)
    assert wire and wire[-1][0] == "message_stop"
