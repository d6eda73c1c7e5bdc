"""Anthropic's Messages API through the proxy, as agents use it: the real `anthropic` SDK pointed at
`rlproxy serve` by base URL only (the rollout in the path), in front of the stub engine, recording into Postgres.
Also: a rollout that mixes APIs, and every other engine route relayed as it is; and what `/tokenize` receives
for `count_tokens` (the two-tenant proxy, whose stand-in engine keeps every body)."""
from __future__ import annotations

import json

import anthropic
import openai
import pytest
import requests

from testkit.stub_engine import BASE_MODEL, EOS_ID, render_chat, tokenize

TOOLS = [{"name": "calculator", "description": "Evaluate an arithmetic expression.",
          "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}},
                           "required": ["expression"]}}]


def new_rollout(proxy_url: str, **body) -> tuple[str, str]:
    response = requests.post(f"{proxy_url}/rollouts", json=body)
    assert response.status_code == 201, response.text
    return response.json()["rollout_id"], response.json()["base_url"]


def client_for(base_url: str) -> anthropic.Anthropic:
    """The Anthropic SDK appends /v1/messages itself: its base URL is the rollout's, without /v1."""
    return anthropic.Anthropic(base_url=base_url.removesuffix("/v1"), api_key="unused", max_retries=0)


def rollout(proxy_url: str, rollout_id: str) -> dict:
    response = requests.get(f"{proxy_url}/rollouts/{rollout_id}")
    assert response.status_code == 200, response.text
    return response.json()


def test_messages_create_is_recorded_with_the_engines_token_ids(proxy_url):
    rollout_id, base_url = new_rollout(proxy_url, task_id="messages-1")
    client = client_for(base_url)

    raw = client.messages.with_raw_response.create(
        model="stub-model", max_tokens=32, system=[{"type": "text", "text": "Answer briefly."}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "What is 6 times 7?"}]}])
    message = raw.parse()

    [call] = rollout(proxy_url, rollout_id)["calls"]
    assert call["status"] == "ok" and call["call_id"] == raw.headers["X-Rlproxy-Call-Id"]
    chat = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 6 times 7?"}]
    assert call["prompt_token_ids"] == tokenize(render_chat(chat))
    [block] = message.content
    assert call["completion_token_ids"] == tokenize(block.text) + [EOS_ID]
    assert len(call["completion_logprobs"]) == len(call["completion_token_ids"])
    assert message.stop_reason == "end_turn" and message.id == f"msg_{call['call_id']}"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (
        len(call["prompt_token_ids"]), len(call["completion_token_ids"]))
    assert "token_ids" not in raw.http_response.text and "logprob" not in raw.http_response.text
    assert call["request"]["system"] == [{"type": "text", "text": "Answer briefly."}]


def test_streamed_message_sends_anthropics_events_and_records_the_same_ids(proxy_url):
    rollout_id, base_url = new_rollout(proxy_url)
    client = client_for(base_url)
    request = {"model": "stub-model", "max_tokens": 32, "messages": [{"role": "user", "content": "Say something."}]}

    whole = client.messages.create(**request)
    with client.messages.stream(**request) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()

    assert final.content[0].text == whole.content[0].text and final.usage.output_tokens == whole.usage.output_tokens
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta"} <= set(kinds)
    first, second = rollout(proxy_url, rollout_id)["calls"]
    assert second["completion_token_ids"] == first["completion_token_ids"]
    assert second["completion_logprobs"] == pytest.approx(first["completion_logprobs"])
    assert second["response"]["content"] == [{"type": "text", "text": final.content[0].text}]


def test_tool_use_round_trip_and_an_is_error_result_gives_an_automatic_reward(proxy_url):
    rollout_id, base_url = new_rollout(proxy_url)
    client = client_for(base_url)
    question = {"role": "user", "content": "Please use tool to compute 6*7."}

    asked = client.messages.create(model="stub-model", max_tokens=64, tools=TOOLS, messages=[question])
    with client.messages.stream(model="stub-model", max_tokens=64, tools=TOOLS, messages=[question]) as stream:
        streamed = stream.get_final_message()
    [use] = asked.content
    assert asked.stop_reason == streamed.stop_reason == "tool_use"
    assert use.type == "tool_use" and use.name == "calculator" and use.input == {"expression": "6*7"}
    assert streamed.content[0].input == use.input
    client.messages.create(model="stub-model", max_tokens=64, tools=TOOLS, messages=[
        question, {"role": "assistant", "content": [use.model_dump(exclude_none=True)]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "is_error": True,
                                      "content": "division by zero"}]}])

    calls = rollout(proxy_url, rollout_id)["calls"]
    assert [c["status"] for c in calls] == ["ok"] * 3
    # The third call's prompt is the conversation rendered by the engine's chat template: it extends the second.
    assert calls[2]["prompt_token_ids"][: len(calls[1]["prompt_token_ids"])] == calls[1]["prompt_token_ids"]
    [air] = rollout(proxy_url, rollout_id)["rewards"]
    assert (air["reason"], air["call_id"], air["metadata"]["tool_call_id"]) == ("tool_error", calls[1]["call_id"],
                                                                                use.id)


@pytest.mark.parametrize("arguments", ['{not json', '"just a string"', '[1, 2]'])
def test_a_malformed_tool_call_streams_as_the_whole_message_has_it(proxy_url, arguments):
    """The small model writes broken JSON now and then: streamed as it came, Anthropic's SDK raised ("Unable to
    parse tool parameter JSON"), so the agent died in streaming mode only. Both forms now carry it under `_raw`."""
    client = client_for(f"{proxy_url}/v1")
    asked = dict(model="stub-model", max_tokens=64, tools=TOOLS, extra_body={"stub_tool_arguments": arguments},
                 messages=[{"role": "user", "content": "Please use tool to compute 6*7."}])
    whole = client.messages.create(**asked)
    with client.messages.stream(**asked) as stream:
        streamed = stream.get_final_message()
    assert whole.content[0].input == streamed.content[0].input == {"_raw": arguments}


def test_count_tokens_is_the_engines_count_for_the_same_prompt(proxy_url):
    client = anthropic.Anthropic(base_url=proxy_url, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "What is 6 times 7?"}]

    counted = client.messages.count_tokens(model="stub-model", messages=messages, system="Answer briefly.")

    chat = [{"role": "system", "content": "Answer briefly."}, *messages]
    assert counted.input_tokens == len(tokenize(render_chat(chat)))


def test_bad_requests_get_anthropic_errors(proxy_url):
    client = anthropic.Anthropic(base_url=proxy_url, api_key="unused", max_retries=0)

    with pytest.raises(anthropic.BadRequestError) as no_max_tokens:
        client.messages.create(model="stub-model", max_tokens=0, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.BadRequestError) as bad_role:
        client.messages.create(model="stub-model", max_tokens=8, messages=[{"role": "tool", "content": "x"}])
    with pytest.raises(anthropic.NotFoundError) as unknown_model:
        client.messages.create(model="no-such-model", max_tokens=8, messages=[{"role": "user", "content": "x"}])
    broken = requests.post(f"{proxy_url}/v1/messages", data=b"{not json", headers={"x-api-key": "unused"})

    assert no_max_tokens.value.body == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "max_tokens: Input should be greater than or equal to 1"}}
    assert "messages.0.role" in bad_role.value.body["error"]["message"]
    assert unknown_model.value.body["error"]["type"] == "not_found_error"  # the engine's 404, in Anthropic's shape
    assert broken.status_code == 400 and broken.json()["type"] == "error"


@pytest.mark.parametrize("content, words", [
    ([{"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "DOC TEXT"}},
      {"type": "text", "text": "summarize"}], "content block type 'document' is not available"),
    ([], "must not be empty"),
    ([{"type": "text", "text": ""}], "text content blocks must be non-empty"),
    ("", "must not be empty"),
])
def test_content_the_prompt_would_lose_is_refused_not_dropped(proxy_url, content, words):
    """A document block was left out of the prompt and the agent got an answer to another question; an empty
    turn sent the engine no messages at all. Anthropic's API refuses both, and so does the proxy."""
    client = anthropic.Anthropic(base_url=proxy_url, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="stub-model", max_tokens=8, messages=[{"role": "user", "content": content}])
    assert words in refused.value.body["error"]["message"]
    # a final assistant turn may be empty (a prefill the model goes on from)
    client.messages.create(model="stub-model", max_tokens=8, messages=[
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}])


def test_one_rollout_may_mix_apis_and_every_call_is_trainable(proxy_url):
    rollout_id, base_url = new_rollout(proxy_url)
    openai_client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)

    openai_client.chat.completions.create(model="stub-model", messages=[{"role": "user", "content": "a"}])
    openai_client.responses.create(model="stub-model", input="b")
    client_for(base_url).messages.create(model="stub-model", max_tokens=16,
                                         messages=[{"role": "user", "content": "c"}])
    requests.post(f"{proxy_url}/reward", json={"rollout_id": rollout_id, "reward": 1.0}).raise_for_status()

    data = rollout(proxy_url, rollout_id)
    assert [c["seq"] for c in data["calls"]] == [1, 2, 3] and data["status"] == "finished"
    assert all(c["prompt_token_ids"] and len(c["completion_logprobs"]) == len(c["completion_token_ids"])
               for c in data["calls"])


def test_listed_engine_routes_are_relayed_byte_for_byte_and_admin_routes_are_not(proxy_url, stub_url):
    rollout_id, base_url = new_rollout(proxy_url)
    body = {"model": "stub-model", "prompt": "one two three"}

    direct = requests.post(f"{stub_url}/tokenize", json=body)
    relayed = requests.post(f"{proxy_url}/tokenize", json=body)
    under_rollout = requests.post(f"{proxy_url}/rollouts/{rollout_id}/tokenize", json=body)
    unknown = requests.get(f"{base_url}/embeddings-nowhere")
    admin = requests.post(f"{base_url}/load_lora_adapter", json={"lora_name": "x", "lora_path": "/tmp"})
    own = requests.get(f"{proxy_url}/rollouts")

    assert relayed.content == under_rollout.content == direct.content and relayed.status_code == 200
    assert unknown.status_code == 404 and "GET /rollouts/" in unknown.json()["error"]["message"]
    assert admin.status_code == 404 and "POST /rollouts/" in admin.json()["error"]["message"]  # never relayed
    assert own.status_code == 405 and "GET /rollouts" in own.json()["error"]["message"]  # only POST is a route
    assert rollout(proxy_url, rollout_id)["calls"] == []  # relayed, never recorded
    metrics = requests.get(f"{proxy_url}/metrics").text
    assert 'rlproxy_passthrough_requests_total{path="/tokenize",status="200"}' in metrics


def test_engine_json_laid_out_with_spaces_is_still_stripped(proxy_url):
    client = openai.OpenAI(base_url=f"{proxy_url}/v1", api_key="unused", max_retries=0)

    raw = client.chat.completions.with_raw_response.create(
        model="stub-model", messages=[{"role": "user", "content": "x"}], logprobs=True,
        extra_body={"stub_spaced": True})

    assert '"token_ids": null' in raw.http_response.text and "prompt_token_ids\": null" in raw.http_response.text
    assert raw.parse().choices[0].logprobs.content  # what the agent asked for stays


def test_a_stream_request_answered_with_one_json_body_is_relayed_and_recorded_as_it_was(proxy_url):
    rollout_id, base_url = new_rollout(proxy_url)

    answer = requests.post(f"{base_url}/chat/completions", json={
        "model": "stub-model", "messages": [{"role": "user", "content": "x"}], "stream": True,
        "stub_plain_json": True})

    assert answer.headers["Content-Type"].startswith("application/json")
    [call] = rollout(proxy_url, rollout_id)["calls"]
    assert call["stream"] is False and call["status"] == "ok"
    assert call["completion_token_ids"] and call["response"]["choices"][0]["message"]["content"] == \
        answer.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize("model,status", [("stub-fail-500-html", 500), ("stub-fail-503-text", 503)])
def test_an_engine_error_that_is_not_json_reaches_the_agent_as_an_anthropic_error(proxy_url, model, status):
    client = anthropic.Anthropic(base_url=proxy_url, api_key="unused", max_retries=0)

    with pytest.raises(anthropic.APIStatusError) as failed:
        client.messages.create(model=model, max_tokens=8, messages=[{"role": "user", "content": "x"}])

    assert failed.value.status_code == status
    assert failed.value.response.headers["Content-Type"].startswith("application/json")
    assert failed.value.body["type"] == "error" and str(status) in failed.value.body["error"]["message"]


def test_unknown_fields_are_refused_by_name_and_the_apis_own_are_taken(proxy_url):
    client = anthropic.Anthropic(base_url=proxy_url, api_key="unused", max_retries=0)
    hello = [{"role": "user", "content": "hi"}]

    with pytest.raises(anthropic.BadRequestError) as misspelt:
        client.messages.create(model="stub-model", max_tokens=8, messages=hello, extra_body={"top_kk": 5})
    with pytest.raises(anthropic.BadRequestError) as misspelt_count:
        client.messages.count_tokens(model="stub-model", messages=hello, extra_body={"max_tokens": 5})
    answer = client.beta.messages.create(
        model="stub-model", max_tokens=8, messages=hello, metadata={"user_id": "user-1"}, service_tier="auto",
        stop_sequences=["END"], thinking={"type": "disabled"}, betas=["context-management-2025-06-27"],
        context_management={"edits": []}, mcp_servers=[],
        extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 5})  # as earlier SDKs and Claude Code send them

    assert misspelt.value.body == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "top_kk: Extra inputs are not permitted"}}
    assert "max_tokens" in misspelt_count.value.body["error"]["message"]
    assert answer.content[0].text


# (what the agent asks, the template arguments the chat route renders its /v1/messages call with)
REASONING = [
    ({"thinking": {"type": "disabled"}}, {"reasoning_effort": "none", "enable_thinking": False}),
    ({"output_config": {"effort": "high"}}, {"reasoning_effort": "high", "enable_thinking": True}),
    ({"thinking": {"type": "disabled"}, "output_config": {"effort": "high"}},  # disabled wins, as vLLM orders it
     {"reasoning_effort": "none", "enable_thinking": False}),
    ({"thinking": {"type": "disabled"}, "chat_template_kwargs": {"enable_thinking": True, "reasoning_effort": "low",
                                                                 "custom": 1}},  # the agent's own flag is kept
     {"enable_thinking": True, "reasoning_effort": "none", "custom": 1}),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, None),  # a budget is sampling, not the prompt
]


def tokenize_bodies(tenants) -> list[dict]:
    return [json.loads(body) for path, body in tenants.stub.bodies if path == "/tokenize"]


@pytest.mark.parametrize(("asked", "arguments"), REASONING)
def test_count_tokens_counts_the_prompt_the_reasoning_fields_render(tenants, asked, arguments):
    client = tenants.anthropic("alpha")
    tenants.stub.bodies.clear()

    client.messages.count_tokens(model=BASE_MODEL, messages=[{"role": "user", "content": "What is 6*7?"}],
                                 extra_body=asked)

    [sent] = tokenize_bodies(tenants)
    assert sent.get("chat_template_kwargs") == arguments


@pytest.mark.parametrize(("asked", "arguments"), REASONING)
def test_count_tokens_and_the_call_render_with_the_same_template_arguments_in_vllm(tenants, asked, arguments):
    """vLLM's own request models, given what the engine received for the call and for its count, build the same
    template arguments (vllm/entrypoints/openai/chat_completion/protocol.py `build_chat_params`)."""
    chat_route = pytest.importorskip("vllm.entrypoints.openai.chat_completion.protocol")
    tokenize_route = pytest.importorskip("vllm.entrypoints.serve.tokenize.protocol")
    client = tenants.anthropic("alpha")
    hello = [{"role": "user", "content": "What is 6*7?"}]
    tenants.stub.bodies.clear()

    client.messages.create(model=BASE_MODEL, max_tokens=2048, messages=hello, extra_body=asked)
    client.messages.count_tokens(model=BASE_MODEL, messages=hello, extra_body=asked)

    [call] = [json.loads(body) for path, body in tenants.stub.bodies if path == "/v1/chat/completions"]
    [count] = tokenize_bodies(tenants)
    rendered = chat_route.ChatCompletionRequest(**call).build_chat_params(None, "auto").chat_template_kwargs
    counted = tokenize_route.TokenizeChatRequest(**count).build_chat_params(None, "auto").chat_template_kwargs
    assert counted == rendered
