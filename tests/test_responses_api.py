"""The OpenAI Responses API through the proxy, as agents use it: the real `openai` SDK, the OpenAI Agents SDK with
its default model class and LangChain's `use_responses_api`, each pointed at `rlproxy serve` by base URL only,
in front of the stub engine, recording into real Postgres."""
from __future__ import annotations

import asyncio

import openai
import pytest
import requests

from testkit.stub_engine import EOS_ID, render_chat, tokenize
from tests.support import calls_of, new_rollout

TOOLS = [{"type": "function", "name": "calculator", "description": "Evaluate an arithmetic expression.",
          "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                         "required": ["expression"]}}]


def rewards_of(proxy_url: str, rollout_id: str) -> list[dict]:
    return requests.get(f"{proxy_url}/rollouts/{rollout_id}").json()["rewards"]


def assert_recorded_exactly(call: dict) -> None:
    """Every policy call carries the engine's ids and one sampling logprob per completion token."""
    assert call["status"] == "ok", call
    assert call["prompt_token_ids"] and call["completion_token_ids"]
    assert len(call["completion_logprobs"]) == len(call["completion_token_ids"])


def test_responses_create_is_recorded_with_the_engines_token_ids(proxy_url):
    rollout_id, base_url = new_rollout(proxy_url, task_id="responses-1")
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)

    raw = client.responses.with_raw_response.create(model="stub-model", instructions="Answer briefly.",
                                                    input="What is 6 times 7?", max_output_tokens=32)
    response = raw.parse()

    [call] = calls_of(proxy_url, rollout_id)
    assert_recorded_exactly(call)
    assert call["call_id"] == raw.headers["X-Rlproxy-Call-Id"] and response.id == f"resp_{call['call_id']}"
    chat = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 6 times 7?"}]
    assert call["prompt_token_ids"] == tokenize(render_chat(chat))
    assert call["completion_token_ids"] == tokenize(response.output_text) + [EOS_ID]
    assert response.status == "completed" and response.model == "stub-model"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (
        len(call["prompt_token_ids"]), len(call["completion_token_ids"]))
    # The agent's own request is what is recorded; the engine's ids never reach the agent.
    assert call["request"] == {"model": "stub-model", "instructions": "Answer briefly.",
                               "input": "What is 6 times 7?", "max_output_tokens": 32}
    assert "token_ids" not in raw.http_response.text
    assert response.output[0].content[0].logprobs == []  # none asked for, none given
    assert call["response"] == response.model_dump(mode="json", exclude_unset=True) | call["response"]


def test_streamed_response_sends_the_sdk_events_and_records_the_same_ids(proxy_url):
    rollout_id, base_url = new_rollout(proxy_url)
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)

    include = ["message.output_text.logprobs"]
    whole = client.responses.create(model="stub-model", input="Say something.", include=include)
    with client.responses.stream(model="stub-model", input="Say something.", include=include) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()

    assert final.output_text == whole.output_text
    # the end token has no text, and no delta carries its logprob; the text's logprobs hold it all the same
    assert [e.logprob for e in final.output[0].content[0].logprobs] == pytest.approx(
        [e.logprob for e in whole.output[0].content[0].logprobs])
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert {"response.output_item.added", "response.content_part.added", "response.output_text.delta",
            "response.output_text.done", "response.output_item.done"} <= set(kinds)
    first, second = calls_of(proxy_url, rollout_id)
    assert second["stream"] is True and first["stream"] is False
    assert second["completion_token_ids"] == first["completion_token_ids"]
    assert second["completion_logprobs"] == pytest.approx(first["completion_logprobs"])
    assert second["response"]["output"][0]["content"][0]["text"] == final.output_text


def test_function_tools_round_trip_and_a_failed_tool_gives_an_automatic_reward(proxy_url):
    rollout_id, base_url = new_rollout(proxy_url)
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)

    asked = client.responses.create(model="stub-model", input="Please use tool to compute 6*7.", tools=TOOLS)
    [tool_call] = [item for item in asked.output if item.type == "function_call"]
    assert tool_call.name == "calculator" and tool_call.arguments == '{"expression": "6*7"}'
    answered = client.responses.create(
        model="stub-model", tools=TOOLS, previous_response_id=asked.id,
        input=[{"type": "function_call_output", "call_id": tool_call.call_id,
                "output": "Error: calculator crashed"}])

    first, second = calls_of(proxy_url, rollout_id)
    assert_recorded_exactly(first) and assert_recorded_exactly(second)
    assert answered.output_text and answered.previous_response_id == asked.id
    # The second prompt is the whole conversation, kept by the proxy: it extends the first call exactly.
    assert second["prompt_token_ids"][: len(first["prompt_token_ids"])] == first["prompt_token_ids"]
    [air] = rewards_of(proxy_url, rollout_id)
    assert (air["kind"], air["reason"], air["call_id"]) == ("air", "tool_error", first["call_id"])
    assert air["metadata"]["tool_call_id"] == tool_call.call_id


def test_streamed_tool_call_events(proxy_url):
    _, base_url = new_rollout(proxy_url)
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)

    with client.responses.stream(model="stub-model", input="use tool please", tools=TOOLS) as stream:
        deltas = [event.delta for event in stream if event.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()

    [item] = final.output
    assert item.type == "function_call" and "".join(deltas) == item.arguments == '{"expression": "6*7"}'


def test_previous_response_id_and_get_response_come_from_the_proxys_records(proxy_url):
    _, base_url = new_rollout(proxy_url)
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)

    first = client.responses.create(model="stub-model", input="Remember the number 7.")
    again = client.responses.retrieve(first.id)
    second = client.responses.create(model="stub-model", input="Which number?", previous_response_id=first.id)
    unstored = client.responses.create(model="stub-model", input="Forget this.", store=False)

    assert again.id == first.id and again.output_text == first.output_text
    assert second.previous_response_id == first.id
    with pytest.raises(openai.NotFoundError, match="not found"):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="stub-model", input="x", previous_response_id=unstored.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_does-not-exist")


def test_bad_requests_get_openai_errors_naming_the_parameter(proxy_url):
    client = openai.OpenAI(base_url=f"{proxy_url}/v1", api_key="unused", max_retries=0)

    with pytest.raises(openai.BadRequestError) as missing_input:
        client.responses.create(model="stub-model", input=None)
    with pytest.raises(openai.BadRequestError) as bad_item:
        client.responses.create(model="stub-model", input=[{"type": "function_call_output"}])
    with pytest.raises(openai.BadRequestError) as background:
        client.responses.create(model="stub-model", input="hi", background=True)

    assert missing_input.value.body["param"] == "input"
    assert bad_item.value.body["param"] == "input.0.call_id"
    assert background.value.body["param"] == "background"


def test_openai_agents_sdk_default_model_runs_a_streamed_tool_loop(proxy_url):
    agents = pytest.importorskip("agents")
    rollout_id, base_url = new_rollout(proxy_url, agent="agents-sdk")
    agents.set_tracing_disabled(True)
    agents.set_default_openai_client(openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0),
                                     use_for_tracing=False)
    used = []

    @agents.function_tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        used.append(expression)
        return "42"

    agent = agents.Agent(name="solver", instructions="Solve it.", model="stub-model", tools=[calculator])

    async def run() -> str:
        result = agents.Runner.run_streamed(agent, "Please use tool to compute 6*7.")
        async for _ in result.stream_events():
            pass
        return result.final_output

    final = asyncio.run(run())

    assert used == ["6*7"] and final
    calls = calls_of(proxy_url, rollout_id)
    assert len(calls) == 2 and all(call["stream"] for call in calls)
    for call in calls:
        assert_recorded_exactly(call)
    assert calls[1]["prompt_token_ids"][: len(calls[0]["prompt_token_ids"])] == calls[0]["prompt_token_ids"]


def test_langchain_with_the_responses_api(proxy_url):
    langchain_openai = pytest.importorskip("langchain_openai")
    rollout_id, base_url = new_rollout(proxy_url, agent="langchain")
    model = langchain_openai.ChatOpenAI(model="stub-model", base_url=base_url, api_key="unused",
                                        use_responses_api=True, max_retries=0)

    message = model.invoke("Say something.")

    [call] = calls_of(proxy_url, rollout_id)
    assert_recorded_exactly(call)
    assert message.text == call["response"]["output"][0]["content"][0]["text"]


@pytest.mark.parametrize("model,status", [("stub-fail-500-html", 500), ("stub-fail-503-text", 503)])
def test_an_engine_error_that_is_not_json_reaches_the_agent_as_an_openai_error(proxy_url, model, status):
    client = openai.OpenAI(base_url=f"{proxy_url}/v1", api_key="unused", max_retries=0)

    with pytest.raises(openai.APIStatusError) as failed:
        client.responses.create(model=model, input="hi")

    assert failed.value.status_code == status
    assert failed.value.response.headers["Content-Type"].startswith("application/json")
    assert failed.value.body["type"] == "server_error" and str(status) in failed.value.body["message"]


def test_a_stream_the_engine_cuts_off_ends_with_response_failed(proxy_url):
    rollout_id, base_url = new_rollout(proxy_url)
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)

    events = list(client.responses.create(model="stub-die-after-2", input="hi", stream=True))

    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    assert events[-1].response.status == "failed" and events[-1].response.id == events[0].response.id
    assert "engine" in events[-1].response.error.message
    assert [e.sequence_number for e in events] == list(range(len(events)))
    [call] = calls_of(proxy_url, rollout_id)
    assert call["status"] == "upstream_error" and call["response"]["status"] == "failed"


def test_unknown_fields_are_refused_by_name_and_the_apis_own_are_taken(proxy_url):
    client = openai.OpenAI(base_url=f"{proxy_url}/v1", api_key="unused", max_retries=0)

    with pytest.raises(openai.BadRequestError) as misspelt:
        client.responses.create(model="stub-model", input="hi", extra_body={"temprature": 0.2})
    answer = client.responses.create(
        model="stub-model", input="hi", metadata={"task": "t1"}, store=True, prompt_cache_key="agent-1",
        safety_identifier="user-1", service_tier="auto", truncation="disabled", user="user-1", max_tool_calls=2,
        parallel_tool_calls=False, text={"format": {"type": "text"}}, include=[], temperature=0.5, top_p=0.9)

    assert misspelt.value.body == {"message": "Unknown parameter: 'temprature'.", "type": "invalid_request_error",
                                   "param": "temprature", "code": "unknown_parameter"}
    assert answer.status == "completed" and answer.output_text

