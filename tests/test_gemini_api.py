"""The Gemini API through the proxy, as agents use it: the real `google-genai` SDK pointed at `rlproxy serve` by
`http_options.base_url` only (the rollout's URL without /v1: the SDK adds /v1beta/models/… itself), in front of
the stub engine, recording into Postgres: text, function calls and their results, streaming (`?alt=sse`), the
engine's token ids and logprobs recorded exactly, countTokens, and errors in Google's shape."""
from __future__ import annotations

import json

import pytest
import requests
from google import genai
from google.genai import errors, types

from testkit.stub_engine import EOS_ID, render_chat, tokenize

CALCULATOR = types.Tool(function_declarations=[types.FunctionDeclaration(
    name="calculator", description="Evaluate an arithmetic expression.",
    parameters=types.Schema(type=types.Type.OBJECT, properties={"expression": types.Schema(type=types.Type.STRING)},
                            required=["expression"]))])
ASK_TOOL = "Please use tool to compute 6*7."


def new_rollout(proxy_url: str) -> tuple[str, str]:
    response = requests.post(f"{proxy_url}/rollouts", json={})
    assert response.status_code == 201, response.text
    return response.json()["rollout_id"], response.json()["base_url"].removesuffix("/v1")


def client_for(base_url: str, version: str | None = None) -> genai.Client:
    """google-genai 3 asks /v1/models/…; Gemini CLI's SDK /v1beta/models/… (`version`)."""
    return genai.Client(api_key="unused", http_options=types.HttpOptions(base_url=base_url, api_version=version))


def calls(proxy_url: str, rollout_id: str) -> list[dict]:
    response = requests.get(f"{proxy_url}/rollouts/{rollout_id}")
    assert response.status_code == 200, response.text
    return response.json()["calls"]


def test_generate_content_is_recorded_with_the_engines_token_ids(proxy_url):
    rollout_id, base_url = new_rollout(proxy_url)

    client = client_for(base_url)
    answer = client.models.generate_content(
        model="stub-model", contents="What is 6 times 7?",
        config=types.GenerateContentConfig(system_instruction="Answer briefly.", temperature=1.0,
                                           max_output_tokens=32))

    [call] = calls(proxy_url, rollout_id)
    assert call["status"] == "ok" and call["route"] == "gemini" and answer.response_id == call["call_id"]
    chat = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 6 times 7?"}]
    assert call["prompt_token_ids"] == tokenize(render_chat(chat))
    assert call["completion_token_ids"] == tokenize(answer.text) + [EOS_ID]
    assert len(call["completion_logprobs"]) == len(call["completion_token_ids"])
    assert answer.candidates[0].finish_reason == types.FinishReason.STOP
    assert (answer.usage_metadata.prompt_token_count, answer.usage_metadata.candidates_token_count) == (
        len(call["prompt_token_ids"]), len(call["completion_token_ids"]))
    assert call["request"]["generationConfig"] == {"temperature": 1.0, "maxOutputTokens": 32}
    assert call["response"]["candidates"][0]["content"]["parts"] == [{"text": answer.text}]


@pytest.mark.parametrize("version", [None, "v1beta"])
def test_the_stream_sends_the_same_answer_and_records_the_same_ids(proxy_url, version):
    rollout_id, base_url = new_rollout(proxy_url)
    client = client_for(base_url, version)

    whole = client.models.generate_content(model="stub-model", contents="Say something.")
    chunks = list(client.models.generate_content_stream(model="stub-model", contents="Say something."))

    assert "".join(chunk.text or "" for chunk in chunks) == whole.text
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assert chunks[-1].usage_metadata.candidates_token_count == whole.usage_metadata.candidates_token_count
    first, second = calls(proxy_url, rollout_id)
    assert (first["stream"], second["stream"]) == (False, True)
    assert second["completion_token_ids"] == first["completion_token_ids"]
    assert second["completion_logprobs"] == pytest.approx(first["completion_logprobs"])
    assert second["response"]["candidates"][0]["content"]["parts"] == [{"text": whole.text}]


def test_a_function_call_round_trip_and_an_error_result_gives_an_automatic_reward(proxy_url):
    rollout_id, base_url = new_rollout(proxy_url)
    client = client_for(base_url)
    config = types.GenerateContentConfig(tools=[CALCULATOR])

    asked = client.models.generate_content(model="stub-model", contents=ASK_TOOL, config=config)
    streamed = [c for c in client.models.generate_content_stream(model="stub-model", contents=ASK_TOOL, config=config)
                if c.function_calls]
    [call] = asked.function_calls
    assert (call.name, call.args) == ("calculator", {"expression": "6*7"}) and call.id
    assert [(c.name, c.args) for c in streamed[0].function_calls] == [("calculator", {"expression": "6*7"})]
    history = [types.Content(role="user", parts=[types.Part(text=ASK_TOOL)]), asked.candidates[0].content,
               types.Content(role="user", parts=[types.Part.from_function_response(
                   name="calculator", response={"error": "division by zero"})])]
    client.models.generate_content(model="stub-model", contents=history, config=config)

    recorded = calls(proxy_url, rollout_id)
    assert [c["status"] for c in recorded] == ["ok"] * 3
    assert recorded[2]["prompt_token_ids"][: len(recorded[1]["prompt_token_ids"])] == recorded[1]["prompt_token_ids"]
    rewards = requests.get(f"{proxy_url}/rollouts/{rollout_id}").json()["rewards"]
    [air] = rewards
    assert (air["reason"], air["call_id"], air["metadata"]["tool_call_id"]) == (
        "tool_error", recorded[1]["call_id"], call.id)  # answered by name: matched to the call's own id


def test_tool_config_and_generation_config_reach_the_engine(proxy_url):
    rollout_id, base_url = new_rollout(proxy_url)
    client = client_for(base_url)

    answer = client.models.generate_content(model="stub-model", contents=ASK_TOOL, config=types.GenerateContentConfig(
        tools=[CALCULATOR], candidate_count=2, top_k=5, stop_sequences=["END"], seed=3,
        tool_config=types.ToolConfig(function_calling_config=types.FunctionCallingConfig(
            mode="ANY", allowed_function_names=["calculator"]))))

    assert len(answer.candidates) == 2
    [call] = calls(proxy_url, rollout_id)
    assert len(call["choices"]) == 2 and all(choice["token_ids"] for choice in call["choices"])


def test_count_tokens_is_the_engines_count_for_the_same_prompt(proxy_url):
    client = client_for(proxy_url)

    counted = client.models.count_tokens(model="stub-model", contents="What is 6 times 7?")

    assert counted.total_tokens == len(tokenize(render_chat([{"role": "user", "content": "What is 6 times 7?"}])))


def test_errors_are_in_googles_shape_with_the_right_status(proxy_url):
    client = client_for(proxy_url)
    url = f"{proxy_url}/v1beta/models/stub-model"
    hello = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}

    with pytest.raises(errors.ClientError) as unknown_model:
        client.models.generate_content(model="no-such-model", contents="x")
    with pytest.raises(errors.ClientError) as slashed:  # served names may hold one: Qwen/Qwen3-8B
        client.models.generate_content(model="no-such/model", contents="x")
    misspelt = requests.post(f"{url}:generateContent", json={**hello, "generationConfig": {"topKk": 5}})
    server_tool = requests.post(f"{url}:generateContent", json={**hello, "tools": [{"googleSearch": {}}]})
    no_sse = requests.post(f"{url}:streamGenerateContent", json=hello)
    key_in_url = requests.post(f"{url}:generateContent?key=secret", json=hello)
    too_many = requests.post(f"{url}:generateContent", json={**hello, "generationConfig": {"candidateCount": 129}})
    unserved = requests.post(f"{url}:embedContent", json=hello)

    assert unknown_model.value.code == 404 and unknown_model.value.status == "NOT_FOUND"
    assert slashed.value.code == 404 and "`no-such/model` does not exist" in slashed.value.message  # the engine's
    assert misspelt.status_code == 400 and misspelt.json() == {"error": {
        "code": 400, "status": "INVALID_ARGUMENT",
        "message": "Invalid JSON payload received. Unknown name \"topKk\" at 'generationConfig': Cannot find field."}}
    assert server_tool.status_code == 400 and "googleSearch" in server_tool.json()["error"]["message"]
    assert no_sse.status_code == 400 and "alt=sse" in no_sse.json()["error"]["message"]
    assert key_in_url.status_code == 401 and key_in_url.json()["error"]["status"] == "UNAUTHENTICATED"
    assert too_many.status_code == 400 and "limit of 128" in too_many.json()["error"]["message"]
    assert unserved.status_code == 404 and unserved.json()["error"]["status"] == "NOT_FOUND"
    assert ":generateContent" in unserved.json()["error"]["message"]  # it names what is served


def test_an_unknown_api_under_a_rollout_names_what_is_served(proxy_url):
    rollout_id, base_url = new_rollout(proxy_url)

    answer = requests.post(f"{base_url}/v1/audio/speech", json={})

    assert answer.status_code == 404
    message = answer.json()["error"]["message"]
    assert f"served under /rollouts/{rollout_id}" in message and "/v1/messages" in message
    assert "/v1beta/models/{model}:generateContent" in message


def test_a_malformed_function_call_is_kept_whole_whole_and_streamed(proxy_url):
    client = client_for(proxy_url)
    config = types.GenerateContentConfig(tools=[CALCULATOR], http_options=types.HttpOptions(
        extra_body={"stub_tool_arguments": "{not json"}))

    whole = client.models.generate_content(model="stub-model", contents=ASK_TOOL, config=config)
    streamed = [c for c in client.models.generate_content_stream(model="stub-model", contents=ASK_TOOL,
                                                                 config=config) if c.function_calls]

    assert whole.function_calls[0].args == streamed[0].function_calls[0].args == {"_raw": "{not json"}


def test_the_recorded_call_reads_as_chat(proxy_url):
    """What automatic rewards and the judge read (core/chat_view.py)."""
    from core.chat_view import chat_view

    rollout_id, base_url = new_rollout(proxy_url)
    client = client_for(base_url)
    client.models.generate_content(model="stub-model", contents=ASK_TOOL,
                                   config=types.GenerateContentConfig(tools=[CALCULATOR]))
    [call] = calls(proxy_url, rollout_id)

    request, response = chat_view("gemini", call["request"], call["response"])

    assert request["messages"] == [{"role": "user", "content": ASK_TOOL}]
    assert request["tools"][0]["function"]["parameters"]["type"] == "object"
    [tool_call] = response["choices"][0]["message"]["tool_calls"]
    assert json.loads(tool_call["function"]["arguments"]) == {"expression": "6*7"}


# GenerateContentConfig fields google-genai never sends to the Gemini API: the client's own, or refused by the SDK
# itself outside Vertex AI / Gemini Enterprise.
CLIENT_SIDE = {"httpOptions", "shouldReturnHttpResponse", "automaticFunctionCalling", "automaticContinuation",
               "modelSelectionConfig", "modelArmorConfig", "generationOutputConfig"}


def test_every_field_the_sdk_sends_is_one_the_route_knows():
    """An SDK upgrade that adds a field fails here first, not as a 400 to its users."""
    from proxy.dialects.fields import GEMINI, GEMINI_GENERATION

    def camel(name: str) -> str:
        first, *rest = name.split("_")
        return first + "".join(word.title() for word in rest)

    sent = {camel(name) for name in types.GenerateContentConfig.model_fields} - CLIENT_SIDE
    assert sent - GEMINI - GEMINI_GENERATION == set()


def test_a_redacted_gemini_call_keeps_its_shape_and_loses_its_text():
    """--redact scrubs systemInstruction, contents and candidates as it scrubs the other APIs' text fields."""
    from datetime import datetime, timezone

    from proxy.recording import redact_record
    from store.records import CallRecord

    call = {"functionCall": {"id": "c1", "name": "calculator", "args": {"expression": "6*7"}}}
    record = CallRecord("x", "gemini", datetime.now(timezone.utc), prompt_token_ids=[1, 2], request={
        "model": "stub-model", "systemInstruction": {"parts": [{"text": "secret system"}]},
        "contents": [{"role": "user", "parts": [{"text": "secret question"}]}, {"role": "model", "parts": [call]}],
        "generationConfig": {"temperature": 1.0}}, response={"candidates": [
            {"content": {"role": "model", "parts": [{"text": "secret answer"}]}, "finishReason": "STOP"}]})

    redact_record(record)

    assert "secret" not in json.dumps([record.request, record.response])
    assert record.request["contents"][0]["role"] == "user" and record.request["generationConfig"] == {"temperature": 1.0}
    assert record.request["contents"][1]["parts"][0]["functionCall"]["name"] == "calculator"
    assert record.response["candidates"][0]["finishReason"] == "STOP" and record.prompt_token_ids == [1, 2]


def test_the_key_is_read_from_x_goog_api_key_and_held_to_its_rollout(proxy_url):
    """The edge reads Google's header as it reads Authorization: a rollout's token there is good for its own
    rollout alone (with keys off too), so the header is not a way around the key checks."""
    own = requests.post(f"{proxy_url}/rollouts", json={}).json()
    other = requests.post(f"{proxy_url}/rollouts", json={}).json()
    hello = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}

    def ask(rollout: dict) -> requests.Response:
        return requests.post(f"{proxy_url}/rollouts/{rollout['rollout_id']}/v1beta/models/stub-model:generateContent",
                             json=hello, headers={"x-goog-api-key": own["token"]})

    assert ask(own).status_code == 200
    refused = ask(other)
    assert refused.status_code == 404 and refused.json()["error"]["status"] == "NOT_FOUND"
