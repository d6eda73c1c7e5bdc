"""The Responses and Messages APIs against the real engine: the real `openai` and `anthropic` SDKs talk to
`rlproxy serve` (a real process, pointed at by `base_url` only) in front of the real vLLM serving
SmolLM2-135M-Instruct, and the proxy records into real Postgres.

The proxy serves both APIs by translating them to a chat request (the one engine route that returns exact
token ids and sampling logprobs) and the chat answer back. vLLM serves both APIs natively as well, so the
engine's own routes are the reference here: for the same request, at temperature 0, the proxy's prompt ids,
answer, stop reason and usage must be the engine's.

* Responses: vLLM's `/v1/responses` with `"enable_response_messages": true` (a vLLM extension) reports the ids
  it computed on: `input_messages` is one `{"type": "raw_message_tokens", "message": <rendered prompt>,
  "tokens": <prompt ids>}` and `output_messages` one such entry with the completion ids (EOS included), in
  streamed answers too (in `response.completed`). The recorded ids are compared with those, id for id.
* Messages: vLLM's `/v1/messages` reports no ids at all (only `usage.input_tokens`, streamed or not), so the
  recorded prompt ids are compared with `/tokenize` of the chat messages vLLM's own converter builds (spelled
  out where a case gives them) and their count with the native route's `usage.input_tokens` and
  `count_tokens`.

Requests are greedy and short (a forced tool call is 31 tokens, so those cases allow 40), so the module stays
quick on a small CPU.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engine_dialects import (  # what the Responses and Messages tests share
    GREEDY,
    QUESTION,
    RESPONSES_TOOL,
    TOOL_MAX_TOKENS,
    TOOL_SYSTEM,
    assert_ids_decode_to,
    assert_nothing_injected,
    native,
    openai_client,
    serving_proxy,
    shape,
    sse_events,
)
from tests.engine_reads import detokenize, link_kind, recorded_calls, without_eos

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def proxy(engine_url: str, database_url: str, run_dir: Path) -> Iterator[str]:
    """One `rlproxy serve` for this module, in front of the shared real engine."""
    with serving_proxy(engine_url, database_url, run_dir, "proxy-responses") as url:
        yield url


RESPONSES_CASES = {
    # instructions, a developer message and a user message in two parts; cut short by max_output_tokens.
    # (SmolLM2's template has no developer role: vLLM turns it into a system message and merges all system
    # messages into the first, "Be brief.\n\nAnswer in one word."; parts are joined with "\n".)
    "items-incomplete": {"instructions": "Be brief.", "max_output_tokens": 4, "input": [
        {"role": "developer", "content": "Answer in one word."},
        {"role": "user", "content": [{"type": "input_text", "text": "What is the capital"},
                                     {"type": "input_text", "text": "of France?"}]}]},
    # a plain string input that the model answers in full
    "string-completed": {"input": QUESTION, "max_output_tokens": 16},
}


@pytest.mark.parametrize("case", list(RESPONSES_CASES))
def test_responses_record_the_engines_prompt_ids_and_answer_as_its_own_route(proxy, engine_url, engine_model, case):
    rollout_id, client = openai_client(proxy)
    request = {"model": engine_model, **RESPONSES_CASES[case], **GREEDY}

    raw = client.responses.with_raw_response.create(**request)
    response = raw.parse()
    own = native(engine_url, "/v1/responses", {**request, "enable_response_messages": True})

    [call] = recorded_calls(proxy, rollout_id)
    [own_input], [own_output] = own["input_messages"], own["output_messages"]
    assert own_input["type"] == own_output["type"] == "raw_message_tokens"
    # The ids the proxy recorded are the ones the engine's own Responses route computes on.
    assert call["prompt_token_ids"] == own_input["tokens"]
    assert call["completion_token_ids"] == own_output["tokens"]
    assert_ids_decode_to(engine_url, engine_model, call, response.output_text)
    # The answer is the engine's own: text, status, why it is incomplete, usage.
    [own_message] = own["output"]
    assert response.output_text == own_message["content"][0]["text"] == own_output["message"]
    assert response.status == own["status"]
    assert (response.incomplete_details and response.incomplete_details.model_dump()) == own["incomplete_details"]
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (
        own["usage"]["input_tokens"], own["usage"]["output_tokens"], own["usage"]["total_tokens"])
    assert response.usage.input_tokens == len(call["prompt_token_ids"])
    assert response.usage.output_tokens == len(call["completion_token_ids"])
    # Nothing the proxy asked the engine for reaches the agent, and what is recorded is what the agent sent.
    assert_nothing_injected(raw.http_response.text)
    assert response.output[0].content[0].logprobs == []
    assert call["request"] == request and call["route"] == "responses"
    assert response.id == f"resp_{call['call_id']}"


# -- Responses: 2. streaming ---------------------------------------------------------------------------
def test_responses_stream_is_the_sdks_event_stream_and_records_what_the_whole_answer_does(proxy, engine_url,
                                                                                          engine_model):
    rollout_id, client = openai_client(proxy)
    request = {"model": engine_model, "input": QUESTION, "max_output_tokens": 16, **GREEDY}

    whole = client.responses.create(**request)
    with client.responses.stream(**request) as stream:
        events = list(stream)
        final = stream.get_final_response()
    wire = sse_events(f"{proxy}/rollouts/{rollout_id}/v1/responses", request)  # the same stream, as sent
    own_events = sse_events(f"{engine_url}/v1/responses", {**request, "enable_response_messages": True})

    kinds = [event.type for event in events]
    # The SDK's stream helper parsed every event; they are the engine's own kinds, in its order.
    assert shape(kinds) == shape([kind for kind, _ in own_events]) == shape([kind for kind, _ in wire])
    assert_nothing_injected(json.dumps([data for _, data in wire]))
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert all(event.logprobs == [] for event in events if event.type == "response.output_text.delta")
    assert "".join(deltas) == final.output_text == whole.output_text
    assert final.status == whole.status == "completed"
    assert final.usage.model_dump() == whole.usage.model_dump()

    plain, streamed, again = recorded_calls(proxy, rollout_id)
    assert streamed["stream"] and not plain["stream"]
    assert streamed["request"] == again["request"] == {**request, "stream": True}
    assert again["completion_token_ids"] == streamed["completion_token_ids"]
    assert streamed["prompt_token_ids"] == plain["prompt_token_ids"]
    assert streamed["completion_token_ids"] == plain["completion_token_ids"]
    assert len(streamed["completion_logprobs"]) == len(streamed["completion_token_ids"])
    # The second prompt comes from the prefix cache, so logprobs may differ in the last digits.
    assert streamed["completion_logprobs"] == pytest.approx(plain["completion_logprobs"], abs=1e-3)
    assert streamed["finish_reason"] == plain["finish_reason"] == "stop"
    assert streamed["response"]["output"][0]["content"][0]["text"] == final.output_text
    # vLLM's own route streams the ids too, in `response.completed`: they are the recorded ones.
    completed = own_events[-1][1]["response"]
    assert completed["input_messages"][0]["tokens"] == streamed["prompt_token_ids"]
    assert completed["output_messages"][0]["tokens"] == streamed["completion_token_ids"]


def test_a_response_cut_short_streams_as_incomplete(proxy, engine_url, engine_model):
    rollout_id, client = openai_client(proxy)
    request = {"model": engine_model, "input": QUESTION, "max_output_tokens": 4, **GREEDY}

    with client.responses.stream(**request) as stream:
        events = list(stream)
    own_events = sse_events(f"{engine_url}/v1/responses", {**request, "enable_response_messages": True})

    # The last event is OpenAI's `response.incomplete` (so the SDK's `get_final_response()`, which waits for
    # `response.completed`, raises, as it does against OpenAI); vLLM's own route ends with `response.completed`
    # carrying the same incomplete Response. Everything before it is the same.
    kinds, own_kinds = [event.type for event in events], [kind for kind, _ in own_events]
    assert shape(kinds)[:-1] == shape(own_kinds)[:-1] and kinds[-1] == "response.incomplete"
    last, own_last = events[-1].response, own_events[-1][1]["response"]
    assert (last.status, last.incomplete_details.reason) == (own_last["status"], "max_output_tokens")
    assert last.status == "incomplete"
    assert own_last["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last.output_text == own_last["output"][0]["content"][0]["text"]
    assert (last.usage.input_tokens, last.usage.output_tokens) == (own_last["usage"]["input_tokens"], 4)
    [call] = recorded_calls(proxy, rollout_id)
    assert call["finish_reason"] == "length"
    assert call["completion_token_ids"] == own_last["output_messages"][0]["tokens"]


# -- Responses: 3. a tool call -------------------------------------------------------------------------
def test_responses_tool_call_is_the_engines_own(proxy, engine_url, engine_model):
    rollout_id, client = openai_client(proxy)
    request = {"model": engine_model, "instructions": TOOL_SYSTEM, "input": "What is 6 times 7?",
               "tools": [RESPONSES_TOOL], "tool_choice": "required", "max_output_tokens": TOOL_MAX_TOKENS,
               **GREEDY}

    whole = client.responses.create(**request)
    with client.responses.stream(**request) as stream:
        events = list(stream)
        final = stream.get_final_response()
    own = native(engine_url, "/v1/responses", {**request, "enable_response_messages": True})

    [own_call] = own["output"]
    [call_item] = whole.output
    assert own_call["type"] == call_item.type == "function_call"
    assert (call_item.name, call_item.arguments) == (own_call["name"], own_call["arguments"])
    assert json.loads(call_item.arguments) == {"expression": "6*7"}
    assert whole.status == own["status"] == "completed"
    assert (whole.usage.input_tokens, whole.usage.output_tokens) == (own["usage"]["input_tokens"],
                                                                    own["usage"]["output_tokens"])
    # Streamed: the SDK assembled the same call from the argument deltas.
    [streamed_item] = final.output
    deltas = [event.delta for event in events if event.type == "response.function_call_arguments.delta"]
    assert "".join(deltas) == streamed_item.arguments == call_item.arguments
    assert (streamed_item.type, streamed_item.name) == ("function_call", "calculate")

    plain, streamed = recorded_calls(proxy, rollout_id)
    assert plain["prompt_token_ids"] == streamed["prompt_token_ids"] == own["input_messages"][0]["tokens"]
    assert plain["completion_token_ids"] == streamed["completion_token_ids"] == own["output_messages"][0]["tokens"]
    assert plain["finish_reason"] == streamed["finish_reason"] == "tool_calls"
    assert len(streamed["completion_logprobs"]) == len(streamed["completion_token_ids"])
    # The ids are the call as the model wrote it, in the template's tool-call syntax.
    text = detokenize(engine_url, engine_model, without_eos(plain["completion_token_ids"], "stop"))
    assert text.startswith("<tool_call>") and json.loads(text.split("\n")[1])["name"] == "calculate"


# -- Responses: 4. previous_response_id ----------------------------------------------------------------
def test_previous_response_id_continues_from_the_first_calls_ids(proxy, engine_url, engine_model):
    rollout_id, client = openai_client(proxy)

    first = client.responses.create(model=engine_model, input=QUESTION, max_output_tokens=16, **GREEDY)
    assert first.status == "completed"  # the turn ended with EOS, as the template renders it
    second = client.responses.create(model=engine_model, input="And of Germany?", previous_response_id=first.id,
                                     max_output_tokens=8, **GREEDY)

    one, two = recorded_calls(proxy, rollout_id)
    assert two["request"]["previous_response_id"] == first.id == f"resp_{one['call_id']}"
    # The second prompt is the first prompt, the first completion (EOS included), then the new turn.
    assert two["prefix_kind"] == link_kind(one, two["prompt_token_ids"]) == "extends"
    assert two["prefix_parent_id"] == one["call_id"]
    head = one["prompt_token_ids"] + one["completion_token_ids"]
    assert two["prompt_token_ids"][: len(head)] == head
    # ...and it is the prompt the engine's own route builds for the same conversation sent whole. (vLLM's own
    # previous_response_id needs its response store, off by default; the proxy keeps the state itself.)
    conversation = [{"role": "user", "content": QUESTION}, first.output[0].model_dump(mode="json"),
                    {"role": "user", "content": "And of Germany?"}]
    own = native(engine_url, "/v1/responses", {"model": engine_model, "input": conversation,
                                               "max_output_tokens": 8, **GREEDY, "enable_response_messages": True})
    assert two["prompt_token_ids"] == own["input_messages"][0]["tokens"]
    assert two["completion_token_ids"] == own["output_messages"][0]["tokens"]
    assert second.output_text == own["output"][0]["content"][0]["text"]


# -- Responses: 5. logprobs when asked -----------------------------------------------------------------
def test_responses_logprobs_only_when_asked_and_then_the_engines(proxy, engine_url, engine_model):
    rollout_id, client = openai_client(proxy)
    request = {"model": engine_model, "input": "Say hi.", "max_output_tokens": 8,
               "include": ["message.output_text.logprobs"], **GREEDY}

    response = client.responses.create(**request)
    own = native(engine_url, "/v1/responses", request)

    [call] = recorded_calls(proxy, rollout_id)
    logprobs = response.output[0].content[0].logprobs
    own_logprobs = own["output"][0]["content"][0]["logprobs"]
    assert [entry.token for entry in logprobs] == [entry["token"] for entry in own_logprobs]
    assert [entry.logprob for entry in logprobs] == pytest.approx([e["logprob"] for e in own_logprobs], abs=1e-3)
    # The agent's logprobs are the sampling logprobs the proxy recorded, token for token.
    assert [entry.logprob for entry in logprobs] == pytest.approx(call["completion_logprobs"][: len(logprobs)])
    assert call["request"] == request


# -- Responses: 6. how input items render ---------------------------------------------------------------
REASONING = {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Hm."}]}
RESPONSES_RENDERING = {
    # a tool round trip sent back whole: the call joins the assistant message before it, the output is a
    # `tool` message
    "tool-round-trip": [
        {"role": "user", "content": "What is 6 times 7?"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me see.",
                                                              "annotations": []}]},
        {"type": "function_call", "call_id": "call_1", "name": "calculate", "arguments": '{"expression": "6*7"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "42"}],
    # a turn that was only reasoning: vLLM keeps it as an assistant message (`reasoning`, no text), which this
    # template renders as an empty assistant turn
    "reasoning-only-turn": [{"role": "user", "content": "Hi"}, REASONING, {"role": "user", "content": "Again"}],
    # a developer message mid-conversation: the template has no developer role, so vLLM merges it into the
    # (default) system message
    "developer-mid-conversation": [{"role": "user", "content": "Hi"}, {"role": "developer", "content": "Be brief."},
                                   {"role": "user", "content": "Again"}],
}


@pytest.mark.parametrize("case", list(RESPONSES_RENDERING))
def test_responses_input_items_render_as_the_engines_own_route(proxy, engine_url, engine_model, case):
    rollout_id, client = openai_client(proxy)
    request = {"model": engine_model, "input": RESPONSES_RENDERING[case], "tools": [RESPONSES_TOOL],
               "max_output_tokens": 1, **GREEDY}

    client.responses.create(**request)
    own = native(engine_url, "/v1/responses", {**request, "enable_response_messages": True})

    [call] = recorded_calls(proxy, rollout_id)
    assert call["prompt_token_ids"] == own["input_messages"][0]["tokens"]
    assert call["completion_token_ids"] == own["output_messages"][0]["tokens"]


# -- Messages: 1. prompt ids and answer ----------------------------------------------------------------
