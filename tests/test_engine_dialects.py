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
from pathlib import Path

import anthropic
import openai
import pytest
import requests

from tests.support import running_proxy, wait_http
from tests.test_engine_exactness import EOS, detokenize, link_kind, recorded_calls, tokenize, without_eos

pytestmark = pytest.mark.engine

# This `anthropic` SDK has no sampling parameters on `messages.create`/`stream`: agents send them as extra body
# fields, which reach the request body as they are (and the proxy and vLLM both read them).
GREEDY = {"temperature": 0}
QUESTION = "What is the capital of France? Answer in one word."  # the model ends its turn in 8 tokens
TOOL_SYSTEM = ("You can use a calculator. To call it, answer with exactly\n<tool_call>\n"
               '{"name": "calculate", "arguments": {"expression": "2+2"}}\n</tool_call>')
CALCULATOR_SCHEMA = {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}
RESPONSES_TOOL = {"type": "function", "name": "calculate", "description": "Evaluate an arithmetic expression.",
                  "parameters": CALCULATOR_SCHEMA}
MESSAGES_TOOL = {"name": "calculate", "description": "Evaluate an arithmetic expression.",
                 "input_schema": CALCULATOR_SCHEMA}
TOOL_MAX_TOKENS = 40  # a forced call takes 31 tokens, EOS included
INJECTED = ('"token_ids"', '"prompt_token_ids"', '"logprob"', '"input_messages"', '"output_messages"')


# -- fixtures and helpers ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def proxy(engine_url: str, database_url: str, run_dir: Path) -> str:
    """One `rlproxy serve` for this module, in front of the shared real engine."""
    with running_proxy([engine_url], database_url, run_dir, "proxy-dialects") as url:
        wait_http(url + "/readyz", timeout=60)
        yield url


def new_rollout(proxy: str) -> tuple[str, str]:
    """A fresh rollout: its id and the base URL an agent is given (ends in /v1)."""
    response = requests.post(f"{proxy}/rollouts", json={"task_id": "dialects"})
    assert response.status_code == 201, response.text
    return response.json()["rollout_id"], response.json()["base_url"]


def openai_client(proxy: str) -> tuple[str, openai.OpenAI]:
    rollout_id, base_url = new_rollout(proxy)
    # No retries: a retried request would be a second recorded call.
    return rollout_id, openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=180)


def anthropic_client(proxy: str) -> tuple[str, anthropic.Anthropic]:
    rollout_id, base_url = new_rollout(proxy)
    # The Anthropic SDK appends /v1/messages to its base URL itself.
    return rollout_id, anthropic.Anthropic(base_url=base_url.removesuffix("/v1"), api_key="unused", max_retries=0,
                                           timeout=180)


def native(engine_url: str, path: str, body: dict) -> dict:
    """The engine's own answer to `body` on its own route."""
    response = requests.post(f"{engine_url}{path}", json=body, timeout=180)
    assert response.status_code == 200, response.text
    return response.json()


def sse_events(url: str, body: dict) -> list[tuple[str, dict]]:
    """The event stream `url` answers `body` with, read off the wire: (event name, data) pairs."""
    response = requests.post(url, json={**body, "stream": True}, timeout=180)
    assert response.status_code == 200, response.text
    events = []
    for block in response.text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in lines and lines["data"] != "[DONE]":  # (an event with no name would be an error)
            events.append((lines.get("event", "(unnamed)"), json.loads(lines["data"])))
    return events


def shape(kinds: list[str]) -> list[str]:
    """A stream's event sequence with each run of one kind as one: how many tokens one delta carries depends
    on timing (a busy engine sends several at once), so only the order of kinds is comparable."""
    return [kind for index, kind in enumerate(kinds) if index == 0 or kinds[index - 1] != kind]


def assert_nothing_injected(body: str) -> None:
    """What the agent received has none of the fields the proxy asks the engine for (or vLLM's own)."""
    assert not [field for field in INJECTED if field in body], body


def assert_ids_decode_to(engine_url: str, engine_model: str, call: dict, text: str,
                         stop_sequence: str | None = None) -> None:
    """The recorded completion ids are the text the agent got: plus EOS for a turn the model ended, plus the
    stop string for one a stop sequence ended (the model sampled it; the answer leaves it out)."""
    ids = call["completion_token_ids"]
    assert len(call["completion_logprobs"]) == len(ids) > 0  # one sampling logprob per token
    assert all(isinstance(value, float) and value <= 0 for value in call["completion_logprobs"])
    if stop_sequence is not None:
        assert EOS not in ids and detokenize(engine_url, engine_model, ids) == text + stop_sequence
    else:
        assert detokenize(engine_url, engine_model, without_eos(ids, call["finish_reason"])) == text


def blocks(content: list) -> list[dict]:
    """Content blocks as JSON, leaving out an empty text block (see the stop-at-once case)."""
    dumped = [b if isinstance(b, dict) else b.model_dump(mode="json", exclude_none=True) for b in content]
    return [b for b in dumped if b != {"type": "text", "text": ""}]


# -- Responses: 1. prompt ids and answer ---------------------------------------------------------------
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
MESSAGES_CASES = {
    # system as blocks (vLLM joins them with ""), user content as two text blocks (a chat message with two
    # text parts, which vLLM joins with "\n"); cut short by max_tokens.
    "blocks-max-tokens": (
        {"system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": " Answer in one word."}],
         "messages": [{"role": "user", "content": [{"type": "text", "text": "What is the capital"},
                                                   {"type": "text", "text": "of France?"}]}], "max_tokens": 4},
        [{"role": "system", "content": "Be brief. Answer in one word."},
         {"role": "user", "content": [{"type": "text", "text": "What is the capital"},
                                      {"type": "text", "text": "of France?"}]}]),
    "string-end-turn": (
        {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 16},
        [{"role": "user", "content": QUESTION}]),
    # a stop sequence: vLLM reports the string that matched, Anthropic calls it stop_sequence
    "stop-sequence": (
        {"system": "Be brief.", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 16,
         "stop_sequences": ["Paris"]},
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}]),
    # a stop sequence the first token matches: an answer with no text at all
    "stop-at-once": (
        {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 16, "stop_sequences": ["The"]},
        [{"role": "user", "content": QUESTION}]),
}
STOPS = {"blocks-max-tokens": ("max_tokens", None), "string-end-turn": ("end_turn", None),
         "stop-sequence": ("stop_sequence", "Paris"), "stop-at-once": ("stop_sequence", "The")}


@pytest.mark.parametrize("case", list(MESSAGES_CASES))
def test_messages_record_the_engines_prompt_ids_and_answer_as_its_own_route(proxy, engine_url, engine_model, case):
    rollout_id, client = anthropic_client(proxy)
    body, chat_messages = MESSAGES_CASES[case]
    request = {"model": engine_model, **body}

    raw = client.messages.with_raw_response.create(**request, extra_body=GREEDY)
    message = raw.parse()
    own = native(engine_url, "/v1/messages", {**request, **GREEDY})

    [call] = recorded_calls(proxy, rollout_id)
    # vLLM's own route gives no ids: the recorded ones are /tokenize of the chat messages it builds, and as
    # many as it reports.
    assert call["prompt_token_ids"] == tokenize(engine_url, engine_model, messages=chat_messages,
                                                add_generation_prompt=True)
    assert len(call["prompt_token_ids"]) == own["usage"]["input_tokens"]
    # The answer is the engine's own: content, stop reason, stop sequence, usage.
    assert blocks(message.content) == blocks(own["content"])
    assert (message.stop_reason, message.stop_sequence) == (own["stop_reason"], own.get("stop_sequence"))
    assert (message.stop_reason, message.stop_sequence) == STOPS[case]
    assert (message.usage.input_tokens, message.usage.output_tokens) == (own["usage"]["input_tokens"],
                                                                         own["usage"]["output_tokens"])
    assert message.usage.output_tokens == len(call["completion_token_ids"])
    text = "".join(block.text for block in message.content if block.type == "text")
    assert_ids_decode_to(engine_url, engine_model, call, text, message.stop_sequence)
    if case == "stop-at-once":
        # No text: the proxy answers with no content block, as its own stream and vLLM's stream do; vLLM's
        # non-streamed route alone adds one empty text block (for clients that read content[0] blindly).
        assert message.content == [] and own["content"] == [{"type": "text", "text": ""}]
    # Nothing the proxy asked the engine for reaches the agent, and what is recorded is what the agent sent.
    assert_nothing_injected(raw.http_response.text)
    assert call["request"] == {**request, **GREEDY} and call["route"] == "messages"


# -- Messages: 2. a tool round trip's prompt, and count_tokens -----------------------------------------
def test_messages_tool_turns_render_and_count_as_the_engine_does(proxy, engine_url, engine_model):
    rollout_id, client = anthropic_client(proxy)
    # The second turn of a tool round trip, as an agent sends it back after running the tool.
    conversation = {
        "system": TOOL_SYSTEM, "tools": [MESSAGES_TOOL],
        "messages": [
            {"role": "user", "content": "What is 6 times 7?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me compute it."},
                {"type": "tool_use", "id": "toolu_6x7", "name": "calculate", "input": {"expression": "6*7"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_6x7", "content": "42"}]},
        ],
    }
    # What vLLM's converter makes of it: tool input as json.dumps text, the tool result a `tool` message.
    chat_messages = [
        {"role": "system", "content": TOOL_SYSTEM},
        {"role": "user", "content": "What is 6 times 7?"},
        {"role": "assistant", "content": "Let me compute it.", "tool_calls": [
            {"id": "toolu_6x7", "type": "function",
             "function": {"name": "calculate", "arguments": json.dumps({"expression": "6*7"})}}]},
        {"role": "tool", "tool_call_id": "toolu_6x7", "content": "42"},
    ]
    chat_tools = [{"type": "function", "function": {"name": "calculate", "parameters": CALCULATOR_SCHEMA,
                                                    "description": MESSAGES_TOOL["description"]}}]
    expected = tokenize(engine_url, engine_model, messages=chat_messages, tools=chat_tools,
                        add_generation_prompt=True)

    counted = client.messages.count_tokens(model=engine_model, **conversation)
    own_count = native(engine_url, "/v1/messages/count_tokens", {"model": engine_model, **conversation})
    request = {"model": engine_model, **conversation, "max_tokens": 4}
    message = client.messages.create(**request, extra_body=GREEDY)
    own = native(engine_url, "/v1/messages", {**request, **GREEDY})

    assert counted.input_tokens == own_count["input_tokens"] == len(expected)
    [call] = recorded_calls(proxy, rollout_id)  # count_tokens is not a policy call: nothing recorded
    assert call["prompt_token_ids"] == expected
    assert message.usage.input_tokens == own["usage"]["input_tokens"] == len(expected)
    assert blocks(message.content) == blocks(own["content"])
    assert call["request"] == {**request, **GREEDY}


# -- Messages: 3. streaming ----------------------------------------------------------------------------
RAW_MESSAGE_EVENTS = {"message_start", "content_block_start", "content_block_delta", "content_block_stop",
                      "message_delta", "message_stop"}


def test_messages_stream_is_the_sdks_event_stream_and_records_what_the_whole_answer_does(proxy, engine_url,
                                                                                         engine_model):
    rollout_id, client = anthropic_client(proxy)
    request = {"model": engine_model, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 16}

    whole = client.messages.create(**request, extra_body=GREEDY)
    with client.messages.stream(**request, extra_body=GREEDY) as stream:
        events = list(stream)
        final = stream.get_final_message()
    wire = sse_events(f"{proxy}/rollouts/{rollout_id}/v1/messages", {**request, **GREEDY})  # as sent
    own_events = sse_events(f"{engine_url}/v1/messages", {**request, **GREEDY})

    # The SDK's stream helper parsed every event; they are the engine's own kinds, in its order (the proxy
    # also sends Anthropic's `ping`, which the SDK reads and drops).
    kinds = [event.type for event in events if event.type in RAW_MESSAGE_EVENTS]
    assert shape(kinds) == shape([kind for kind, _ in own_events]) == shape([k for k, _ in wire if k != "ping"])
    assert_nothing_injected(json.dumps([data for _, data in wire]))
    texts = [event.text for event in events if event.type == "text"]
    assert "".join(texts) == whole.content[0].text
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in whole.content]
    assert (final.stop_reason, final.stop_sequence) == (whole.stop_reason, whole.stop_sequence) == ("end_turn", None)
    assert (final.usage.input_tokens, final.usage.output_tokens) == (whole.usage.input_tokens,
                                                                     whole.usage.output_tokens)
    own_start, own_delta = own_events[0][1], next(data for kind, data in own_events if kind == "message_delta")
    start = next(event for event in events if event.type == "message_start")
    assert start.message.usage.input_tokens == own_start["message"]["usage"]["input_tokens"]
    assert final.usage.output_tokens == own_delta["usage"]["output_tokens"]

    plain, streamed, again = recorded_calls(proxy, rollout_id)
    assert streamed["stream"] and not plain["stream"]
    assert streamed["request"] == again["request"] == {**request, **GREEDY, "stream": True}
    assert again["completion_token_ids"] == streamed["completion_token_ids"]
    assert streamed["prompt_token_ids"] == plain["prompt_token_ids"]
    assert streamed["completion_token_ids"] == plain["completion_token_ids"]
    assert len(streamed["completion_logprobs"]) == len(streamed["completion_token_ids"])
    assert streamed["completion_logprobs"] == pytest.approx(plain["completion_logprobs"], abs=1e-3)
    assert streamed["response"]["content"] == blocks(final.content)


# -- Messages: 4. a tool call --------------------------------------------------------------------------
def test_messages_tool_use_is_the_engines_own(proxy, engine_url, engine_model):
    rollout_id, client = anthropic_client(proxy)
    request = {"model": engine_model, "system": TOOL_SYSTEM,
               "messages": [{"role": "user", "content": "What is 6 times 7?"}], "tools": [MESSAGES_TOOL],
               "tool_choice": {"type": "any"}, "max_tokens": TOOL_MAX_TOKENS}

    whole = client.messages.create(**request, extra_body=GREEDY)
    with client.messages.stream(**request, extra_body=GREEDY) as stream:
        partial = [event.partial_json for event in stream if event.type == "input_json"]
        final = stream.get_final_message()
    own = native(engine_url, "/v1/messages", {**request, **GREEDY})

    [own_use] = own["content"]
    [use] = whole.content
    assert own_use["type"] == use.type == "tool_use"
    assert (use.name, use.input) == (own_use["name"], own_use["input"]) == ("calculate", {"expression": "6*7"})
    assert whole.stop_reason == own["stop_reason"] == "tool_use"
    assert (whole.usage.input_tokens, whole.usage.output_tokens) == (own["usage"]["input_tokens"],
                                                                     own["usage"]["output_tokens"])
    [streamed_use] = final.content
    assert (streamed_use.type, streamed_use.name, streamed_use.input) == ("tool_use", use.name, use.input)
    assert json.loads("".join(partial)) == use.input and final.stop_reason == "tool_use"

    plain, streamed = recorded_calls(proxy, rollout_id)
    assert plain["prompt_token_ids"] == streamed["prompt_token_ids"]
    assert plain["completion_token_ids"] == streamed["completion_token_ids"]
    assert len(plain["completion_token_ids"]) == whole.usage.output_tokens
    assert len(streamed["completion_logprobs"]) == len(streamed["completion_token_ids"])
    assert plain["completion_token_ids"][-1] == EOS


# -- Messages: 5. how system text, thinking and system turns render ----------------------------------------
BILLING = {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cc_entrypoint=cli; cch=0a1b2;"}
MESSAGES_RENDERING = {
    # Claude Code's system blocks: a per-request billing header (vLLM drops the block), then the real prompt
    "claude-code-system": {"system": [BILLING, {"type": "text", "text": "You are a coding agent.\nBe brief.",
                                                "cache_control": {"type": "ephemeral"}}],
                           "messages": [{"role": "user", "content": "Hi"}]},
    # an assistant turn that was only thinking: vLLM keeps it (`reasoning`, no text), rendered as an empty turn
    "thinking-only-turn": {"messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "Hm.", "signature": "sig"}]},
        {"role": "user", "content": "Again"}]},
    # a system turn mid-conversation in blocks: joined as they are, the header left out
    "inline-system-blocks": {"messages": [
        {"role": "user", "content": "Hi"},
        {"role": "system", "content": [BILLING, {"type": "text", "text": "Be"}, {"type": "text", "text": " brief."}]},
        {"role": "user", "content": "Again"}]},
}


@pytest.mark.parametrize("case", list(MESSAGES_RENDERING))
def test_messages_render_as_the_engines_own_route(proxy, engine_url, engine_model, case):
    rollout_id, client = anthropic_client(proxy)
    request = {"model": engine_model, **MESSAGES_RENDERING[case]}

    counted = client.messages.count_tokens(**request)
    own_count = native(engine_url, "/v1/messages/count_tokens", request)
    message = client.messages.create(**request, max_tokens=1, extra_body=GREEDY)
    own = native(engine_url, "/v1/messages", {**request, "max_tokens": 1, **GREEDY})

    [call] = recorded_calls(proxy, rollout_id)
    assert counted.input_tokens == own_count["input_tokens"] == len(call["prompt_token_ids"])
    assert message.usage.input_tokens == own["usage"]["input_tokens"] == len(call["prompt_token_ids"])
    assert blocks(message.content) == blocks(own["content"])
