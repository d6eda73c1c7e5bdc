"""What the real SDKs see through the proxy at the edges of the three wire formats: an engine that answers a
stream request with one JSON body, and the errors a client gets for a wrong method on the Messages routes. Each
test drives the official `openai` or `anthropic` SDK against `rlproxy serve` in front of the stand-in engine."""
from __future__ import annotations

import anthropic
import openai
import pytest
import requests

from testkit.stub_engine import EOS_ID, tokenize
from tests.support import calls_of, new_rollout

ENGINE_IGNORES_STREAM = {"stub_plain_json": True}  # the stand-in answers `stream: true` with one JSON body
RESPONSES_TOOLS = [{"type": "function", "name": "calculator",
                    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}]
MESSAGES_TOOLS = [{"name": "calculator",
                   "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}}}}]


def test_a_responses_stream_the_engine_answered_whole_reaches_the_sdk_as_its_events(proxy_url):
    rollout_id, base_url = new_rollout(proxy_url)
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    request = {"model": "stub-model", "input": "Say something.", "include": ["message.output_text.logprobs"]}

    streamed = client.responses.create(**request, stream=True)
    with client.responses.stream(**request, extra_body=ENGINE_IGNORES_STREAM) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()

    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds
    assert final.output_text == "".join(e.delta for e in streamed if e.type == "response.output_text.delta")
    first, replayed = calls_of(proxy_url, rollout_id)
    assert replayed["status"] == "ok" and replayed["stream"] is False  # what the engine did, recorded as it was
    assert replayed["completion_token_ids"] == first["completion_token_ids"] == tokenize(final.output_text) + [EOS_ID]
    assert [p.logprob for p in final.output[0].content[0].logprobs] == pytest.approx(replayed["completion_logprobs"])
    assert replayed["response"]["output"][0]["content"][0]["text"] == final.output_text


def test_a_responses_tool_call_the_engine_answered_whole_streams_as_a_function_call(proxy_url):
    client = openai.OpenAI(base_url=f"{proxy_url}/v1", api_key="unused", max_retries=0)

    with client.responses.stream(model="stub-model", input="Please use tool to compute 6*7.", tools=RESPONSES_TOOLS,
                                 extra_body=ENGINE_IGNORES_STREAM) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()

    [call] = final.output
    assert call.type == "function_call" and call.name == "calculator" and call.arguments == '{"expression": "6*7"}'
    assert "response.function_call_arguments.done" in kinds and kinds[-1] == "response.completed"


def test_a_messages_stream_the_engine_answered_whole_reaches_the_sdk_as_its_events(proxy_url):
    rollout_id, base_url = new_rollout(proxy_url)
    client = anthropic.Anthropic(base_url=base_url.removesuffix("/v1"), api_key="unused", max_retries=0)
    request = {"model": "stub-model", "max_tokens": 32, "messages": [{"role": "user", "content": "Say something."}]}

    whole = client.messages.create(**request)
    with client.messages.stream(**request, extra_body=ENGINE_IGNORES_STREAM) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()

    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert final.content[0].text == whole.content[0].text and final.stop_reason == "end_turn"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (whole.usage.input_tokens,
                                                                      whole.usage.output_tokens)
    first, replayed = calls_of(proxy_url, rollout_id)
    assert replayed["status"] == "ok" and replayed["completion_token_ids"] == first["completion_token_ids"]
    assert replayed["response"]["content"] == [{"type": "text", "text": final.content[0].text}]


def test_a_messages_tool_use_the_engine_answered_whole_streams_with_its_input(proxy_url):
    client = anthropic.Anthropic(base_url=proxy_url, api_key="unused", max_retries=0)

    with client.messages.stream(model="stub-model", max_tokens=32, tools=MESSAGES_TOOLS,
                                messages=[{"role": "user", "content": "Please use tool to compute 6*7."}],
                                extra_body=ENGINE_IGNORES_STREAM) as stream:
        final = stream.get_final_message()

    [block] = final.content
    assert (block.type, block.name, block.input) == ("tool_use", "calculator", {"expression": "6*7"})
    assert final.stop_reason == "tool_use"


def test_an_engine_error_to_a_stream_request_is_the_status_the_sdk_raises(proxy_url):
    responses = openai.OpenAI(base_url=f"{proxy_url}/v1", api_key="unused", max_retries=0)
    messages = anthropic.Anthropic(base_url=proxy_url, api_key="unused", max_retries=0)

    with pytest.raises(openai.UnprocessableEntityError):
        list(responses.responses.create(model="stub-model", input="hi", stream=True, extra_body={"stub_status": 422}))
    with pytest.raises(anthropic.RateLimitError) as limited, messages.messages.stream(
            model="stub-model", max_tokens=8, messages=[{"role": "user", "content": "hi"}],
            extra_body={"stub_status": 429}) as stream:
        stream.get_final_message()

    assert limited.value.body == {"type": "error", "error": {"type": "rate_limit_error",
                                                             "message": "stub error on request"}}


def test_a_wrong_method_on_the_messages_routes_is_an_anthropic_invalid_request(proxy_url):
    client = anthropic.Anthropic(base_url=proxy_url, api_key="unused", max_retries=0)

    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        with pytest.raises(anthropic.APIStatusError) as wrong:
            client.get(path, cast_to=object)
        assert wrong.value.status_code == 405
        assert wrong.value.body == {"type": "error", "error": {"type": "invalid_request_error",
                                                               "message": f"Method Not Allowed: GET {path}"}}
    chat = requests.get(f"{proxy_url}/v1/chat/completions")  # the same rule in OpenAI's shape
    assert chat.status_code == 405 and chat.json()["error"]["type"] == "invalid_request_error"


def test_a_messages_api_path_the_proxy_does_not_serve_is_an_anthropic_not_found(proxy_url):
    client = anthropic.Anthropic(base_url=proxy_url, api_key="unused", max_retries=0)

    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.batches.list()

    assert missing.value.body["type"] == "error" and missing.value.body["error"]["type"] == "not_found_error"
    assert requests.get(f"{proxy_url}/v1/no-such-route").json()["error"]["type"] == "not_found_error"


def test_other_client_errors_on_the_messages_routes_are_not_called_the_servers(proxy_url):
    client = anthropic.Anthropic(base_url=proxy_url, api_key="unused", max_retries=0)

    with pytest.raises(anthropic.APIStatusError) as refused:
        client.messages.create(model="stub-model", max_tokens=8, messages=[{"role": "user", "content": "hi"}],
                               extra_headers={"Content-Encoding": "br"})

    assert refused.value.status_code == 415
    assert refused.value.body["error"]["type"] == "invalid_request_error"


def test_structured_output_asked_on_messages_reaches_the_engine_as_its_response_format(proxy_url):
    rollout_id, base_url = new_rollout(proxy_url)
    client = anthropic.Anthropic(base_url=base_url.removesuffix("/v1"), api_key="unused", max_retries=0)
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    ask = {"model": "stub-model", "max_tokens": 16, "messages": [{"role": "user", "content": "What is 6*7?"}]}

    client.messages.create(**ask, output_config={"format": {"type": "json_schema", "schema": schema}})
    client.beta.messages.create(**ask, betas=["structured-outputs-2025-11-13"],  # as earlier SDKs sent it
                                extra_body={"output_format": {"type": "json_schema", "schema": schema}})
    client.messages.create(**ask)

    # the engine was asked for the schema (a constraint on sampling, so its log-probs are not trained as the
    # policy's own), and the call without one was not
    constrained, beta, free = calls_of(proxy_url, rollout_id)
    assert constrained["sampling"] == beta["sampling"] == "response_format=json_schema"
    assert free["sampling"] is None
