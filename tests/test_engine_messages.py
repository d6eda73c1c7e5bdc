"""The Anthropic Messages API against the real engine: the real `anthropic` SDK talks to `rlproxy serve` in
front of the real vLLM; for the same greedy request the proxy's recorded prompt ids, answer, stop reason
and usage must be what vLLM's own `/v1/messages` route and `/tokenize` say (the method:
tests/test_engine_responses.py's docstring). Last, the Gemini API through the same proxy and engine (vLLM has no
Gemini route: its chat route is the reference)."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from google import genai
from google.genai import types as genai_types

from tests.engine_dialects import (  # what the Responses and Messages tests share
    CALCULATOR_SCHEMA,
    GREEDY,
    MESSAGES_TOOL,
    QUESTION,
    TOOL_MAX_TOKENS,
    TOOL_SYSTEM,
    anthropic_client,
    assert_ids_decode_to,
    assert_nothing_injected,
    blocks,
    native,
    new_rollout,
    serving_proxy,
    shape,
    sse_events,
)
from tests.engine_reads import EOS, recorded_calls, tokenize

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def proxy(engine_url: str, database_url: str, run_dir: Path) -> Iterator[str]:
    """One `rlproxy serve` for this module, in front of the shared real engine."""
    with serving_proxy(engine_url, database_url, run_dir, "proxy-messages") as url:
        yield url


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


# -- the Gemini API: the same engine behind the fourth wire format ----------------------------------------
def test_gemini_generate_content_records_the_engines_ids_and_answers_as_its_chat_route(proxy, engine_url,
                                                                                      engine_model):
    """google-genai unmodified, at /v1beta as Gemini CLI asks (the served name may hold a slash): the prompt is the
    chat rendering of systemInstruction and contents, the answer the engine's chat route's own, whole and
    streamed, and the recorded ids are the engine's."""
    rollout_id, base_url = new_rollout(proxy)
    client = genai.Client(api_key="unused", http_options=genai_types.HttpOptions(
        base_url=base_url.removesuffix("/v1"), api_version="v1beta", timeout=180_000))
    config = genai_types.GenerateContentConfig(system_instruction="Be brief.", temperature=0, max_output_tokens=16)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}]

    whole = client.models.generate_content(model=engine_model, contents=QUESTION, config=config)
    chunks = list(client.models.generate_content_stream(model=engine_model, contents=QUESTION, config=config))
    own = native(engine_url, "/v1/chat/completions", {"model": engine_model, "messages": chat, "max_tokens": 16,
                                                      **GREEDY})

    plain, streamed = recorded_calls(proxy, rollout_id)
    assert plain["route"] == streamed["route"] == "gemini" and streamed["stream"] and not plain["stream"]
    assert plain["prompt_token_ids"] == tokenize(engine_url, engine_model, messages=chat, add_generation_prompt=True)
    assert whole.text == own["choices"][0]["message"]["content"] == "".join(c.text or "" for c in chunks)
    assert whole.usage_metadata.prompt_token_count == own["usage"]["prompt_tokens"] == len(plain["prompt_token_ids"])
    assert whole.usage_metadata.candidates_token_count == len(plain["completion_token_ids"])
    assert_ids_decode_to(engine_url, engine_model, plain, whole.text)
    assert streamed["prompt_token_ids"] == plain["prompt_token_ids"]
    assert streamed["completion_token_ids"] == plain["completion_token_ids"]
    assert streamed["completion_logprobs"] == pytest.approx(plain["completion_logprobs"], abs=1e-3)
