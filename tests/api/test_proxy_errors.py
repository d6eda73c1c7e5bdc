"""Bad input gets a clear OpenAI-shaped error with the right status and nothing accepted is lost; engine
failures (errors, unreachable, too slow, dying mid-stream) and clients leaving mid-stream are recorded."""
from __future__ import annotations

import time
import uuid

import openai
import pytest
import requests

from tests.support import free_port, running_proxy


def assert_openai_error(response: requests.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def recorded_calls(proxy_url: str, rollout_id: str) -> list[dict]:
    response = requests.get(f"{proxy_url}/rollouts/{rollout_id}")
    return response.json()["calls"] if response.status_code == 200 else []


@pytest.mark.parametrize("body,param", [
    (b"{not json", None),
    (b"[1, 2]", None),
    (b'{"messages": [{"role": "user", "content": "hi"}]}', "model"),
    (b'{"model": "stub-model"}', "messages"),
    (b'{"model": "stub-model", "messages": "hi"}', "messages"),
    (b'{"model": 7, "messages": [{"role": "user", "content": "hi"}]}', "model"),
    (b'{"model": "stub-model", "messages": []}', "messages"),
    (b'{"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}', "stream"),
])
def test_malformed_chat_requests_are_400_and_not_recorded(proxy_url, body, param):
    rollout_id = uuid.uuid4().hex
    response = requests.post(f"{proxy_url}/rollouts/{rollout_id}/v1/chat/completions", data=body,
                             headers={"Content-Type": "application/json"})
    error = assert_openai_error(response, 400)
    assert error["type"] == "invalid_request_error"
    if param:
        assert error["param"] == param
    assert recorded_calls(proxy_url, rollout_id) == []


def test_the_sdk_raises_bad_request_for_a_bad_rollout_id(proxy_url):
    client = openai.OpenAI(base_url=f"{proxy_url}/v1", api_key="unused", default_headers={"X-Rollout-Id": "a b"})
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="stub-model", messages=[{"role": "user", "content": "hi"}])


def test_reward_errors_follow_the_contract(proxy_url):
    rollout_id = requests.post(f"{proxy_url}/rollouts", json={}).json()["rollout_id"]
    url = f"{proxy_url}/reward"

    assert_openai_error(requests.post(url, json={"rollout_id": "nope", "reward": 1}), 404)
    assert_openai_error(requests.post(url, json={"rollout_id": rollout_id, "reward": 1, "call_id": "nope"}), 404)
    assert_openai_error(requests.post(url, data=b'{"rollout_id": "%s", "reward": NaN}' % rollout_id.encode()), 422)
    error = assert_openai_error(requests.post(url, json={"rollout_id": rollout_id, "reward": "1"}), 422)
    assert (error["param"], error["message"]) == ("reward", "reward: Input should be a valid number")
    assert_openai_error(requests.post(url, json={"rollout_id": rollout_id, "reward": True}), 422)
    assert_openai_error(requests.post(url, data=b'{"rollout_id": "%s", "reward": 1e400}' % rollout_id.encode()), 422)
    # finite but vast: group statistics square it (1e300 overflowed there and stopped the trainer for everyone)
    for vast in (1e300, -1e300, 1e6 + 1):
        error = assert_openai_error(requests.post(url, json={"rollout_id": rollout_id, "reward": vast}), 422)
        assert "between" in error["message"]
    error = assert_openai_error(requests.post(f"{proxy_url}/rollouts/{rollout_id}/events",
                                              json={"event_type": "reward", "data": {"value": 1e300}}), 422)
    assert error["param"] == "data.value"
    assert_openai_error(requests.post(url, json={"reward": 1}), 422)
    assert_openai_error(requests.post(url, data=b"{oops"), 422)

    assert requests.post(url, json={"rollout_id": rollout_id, "reward": 0.5}).status_code == 200
    assert requests.post(url, json={"rollout_id": rollout_id, "reward": 0.5}).status_code == 200  # same: no-op
    assert_openai_error(requests.post(url, json={"rollout_id": rollout_id, "reward": 1.0}), 409)
    rewards = requests.get(f"{proxy_url}/rollouts/{rollout_id}").json()["rewards"]
    assert [(r["kind"], r["value"]) for r in rewards] == [("final", 0.5)]


def test_intermediate_reward_for_a_call(proxy_url):
    rollout_id, base_url = (lambda d: (d["rollout_id"], d["base_url"]))(
        requests.post(f"{proxy_url}/rollouts", json={"task_id": "t"}).json())
    raw = openai.OpenAI(base_url=base_url, api_key="unused").chat.completions.with_raw_response.create(
        model="stub-model", messages=[{"role": "user", "content": "hi"}])
    call_id = raw.headers["X-Rlproxy-Call-Id"]
    response = requests.post(f"{proxy_url}/reward", json={"rollout_id": rollout_id, "reward": -0.2,
                                                           "call_id": call_id})
    assert response.json() == {"rollout_id": rollout_id, "reward": -0.2, "call_id": call_id}
    # the client lost the answer and sent it again: the same reward is stored once (credit does not double)
    again = requests.post(f"{proxy_url}/reward", json={"rollout_id": rollout_id, "reward": -0.2, "call_id": call_id})
    assert again.status_code == 200
    data = requests.get(f"{proxy_url}/rollouts/{rollout_id}").json()
    assert data["status"] == "open"  # an intermediate reward does not close the rollout
    assert data["rewards"] == [dict(data["rewards"][0], call_id=call_id, kind="call", value=-0.2)]
    # another value, or the same value with other metadata, is another reward
    requests.post(f"{proxy_url}/reward", json={"rollout_id": rollout_id, "reward": -0.2, "call_id": call_id,
                                               "metadata": {"judge": "style"}})
    requests.post(f"{proxy_url}/reward", json={"rollout_id": rollout_id, "reward": 0.5, "call_id": call_id})
    values = sorted(r["value"] for r in requests.get(f"{proxy_url}/rollouts/{rollout_id}").json()["rewards"])
    assert values == [-0.2, -0.2, 0.5]


def test_unknown_routes_and_methods_answer_in_openai_shape(proxy_url):
    assert_openai_error(requests.get(f"{proxy_url}/v1/nothing-here"), 404)
    assert_openai_error(requests.get(f"{proxy_url}/v1/chat/completions"), 405)
    assert_openai_error(requests.get(f"{proxy_url}/rollouts/does-not-exist"), 404)


def test_a_client_given_a_mistaken_base_url_is_told_the_path_it_meant(proxy_url):
    """The usual mistakes, through the real SDKs: an OpenAI client given the proxy's URL without /v1, the Anthropic
    SDK (which adds /v1 itself) given it with /v1, a browser opening /ui. Each is still a 404, now saying which
    path would have been answered."""
    import anthropic

    rollout = f"{proxy_url}/rollouts/{uuid.uuid4().hex}"
    client = openai.OpenAI(base_url=rollout, api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError) as missing_v1:
        client.chat.completions.create(model="stub-model", messages=[{"role": "user", "content": "hi"}])
    assert "did you mean /rollouts/" in str(missing_v1.value) and "/v1/chat/completions?" in str(missing_v1.value)

    claude = anthropic.Anthropic(base_url=rollout + "/v1", api_key="x", max_retries=0)
    with pytest.raises(anthropic.NotFoundError) as twice_v1:
        claude.messages.create(model="stub-model", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert "the Anthropic SDK adds /v1 itself" in str(twice_v1.value)

    assert "the web view is at /ui/" in assert_openai_error(requests.get(f"{proxy_url}/ui"), 404)["message"]
    assert "did you mean" not in assert_openai_error(requests.get(f"{proxy_url}/v1/nothing-here"), 404)["message"]


def test_engine_errors_are_relayed_as_they_are_and_recorded(proxy_url, stub_url):
    rollout_id = uuid.uuid4().hex
    body = {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}
    direct = requests.post(f"{stub_url}/v1/chat/completions", json=body)
    proxied = requests.post(f"{proxy_url}/rollouts/{rollout_id}/v1/chat/completions", json=body)
    assert proxied.status_code == direct.status_code == 404
    assert proxied.content == direct.content
    [call] = recorded_calls(proxy_url, rollout_id)
    assert call["status"] == "upstream_error" and call["http_status"] == 404


def test_the_engines_retry_advice_reaches_the_agent_and_its_sdk_follows_it(proxy_url):
    """A 429 with `x-should-retry: false`: the SDK makes one attempt, as it would against the engine itself.
    Without the headers it retried twice at its own pace, and each retry was another failed call recorded."""
    import openai

    rollout_id = uuid.uuid4().hex
    client = openai.OpenAI(base_url=f"{proxy_url}/rollouts/{rollout_id}/v1", api_key="unused", max_retries=2)
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(model="stub-model", messages=[{"role": "user", "content": "hi"}],
                                       extra_body={"stub_status": 429, "stub_retry_after": 3})
    assert refused.value.response.headers["Retry-After"] == "3"
    assert len(recorded_calls(proxy_url, rollout_id)) == 1


@pytest.mark.parametrize("route,body", [
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("completions", {"prompt": "hi"}),
])
def test_an_engine_error_that_is_not_json_is_relayed_in_openai_shape(proxy_url, route, body):
    rollout_id = uuid.uuid4().hex
    response = requests.post(f"{proxy_url}/rollouts/{rollout_id}/v1/{route}",
                             json={"model": "stub-fail-502-html", **body})

    error = assert_openai_error(response, 502)
    assert response.headers["Content-Type"].startswith("application/json")
    assert error["type"] == "server_error" and "502" in error["message"]
    [call] = recorded_calls(proxy_url, rollout_id)
    assert call["status"] == "upstream_error" and "<html>" in call["error"]  # recorded as the engine sent it


def test_unreachable_engine_is_502(database_url, run_dir):
    dead = f"http://127.0.0.1:{free_port()}"
    with running_proxy([dead], database_url, run_dir, "proxy-502") as url:
        rollout_id = uuid.uuid4().hex
        response = requests.post(f"{url}/rollouts/{rollout_id}/v1/chat/completions",
                                 json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        error = assert_openai_error(response, 502)
        assert error["code"] == "upstream_unavailable"
        assert requests.get(url + "/readyz").status_code == 503
        [call] = recorded_calls(url, rollout_id)
        assert call["status"] == "upstream_error" and call["http_status"] == 502
        port = dead.rsplit(":", 1)[1]  # the engine's address is the operator's: not in the answer, not recorded
        assert port not in error["message"] and port not in call["error"] and "engine unreachable" in call["error"]
        relayed = requests.post(f"{url}/tokenize", json={"model": "m", "prompt": "hi"})
        assert relayed.status_code == 502 and port not in relayed.text


def test_slow_engine_is_504(stub_url, database_url, run_dir):
    with running_proxy([stub_url], database_url, run_dir, "proxy-504", "--upstream-timeout", "0.5") as url:
        rollout_id = uuid.uuid4().hex
        body = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                "stub_delay": 0.3}
        response = requests.post(f"{url}/rollouts/{rollout_id}/v1/chat/completions", json=body)
        assert response.status_code == 200  # the stream had started; the error arrives as its last event
        assert b'"code":"upstream_timeout"' in response.content.splitlines()[-2]
        [call] = recorded_calls(url, rollout_id)
        assert call["status"] == "timeout"


def test_engine_dying_mid_stream_ends_the_stream_with_an_error_event(proxy_url):
    rollout_id = uuid.uuid4().hex
    body = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "stub_die_after": 2}
    response = requests.post(f"{proxy_url}/rollouts/{rollout_id}/v1/chat/completions", json=body)
    events = [line for line in response.content.split(b"\n\n") if line]
    assert len(events) == 3 and b'"type":"upstream_error"' in events[-1]
    [call] = recorded_calls(proxy_url, rollout_id)
    assert call["status"] == "upstream_error"
    assert len(call["completion_token_ids"]) == 1  # the one content chunk that did arrive


def test_client_leaving_mid_stream_is_recorded_with_the_partial_call(proxy_url):
    rollout_id = uuid.uuid4().hex
    body = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "stub_delay": 0.2, "max_tokens": 50}
    with requests.post(f"{proxy_url}/rollouts/{rollout_id}/v1/chat/completions", json=body, stream=True) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith(b"data:"))
    deadline = time.monotonic() + 10
    while not (calls := recorded_calls(proxy_url, rollout_id)) and time.monotonic() < deadline:
        time.sleep(0.2)
    [call] = calls
    assert call["status"] == "client_disconnected"
    assert call["finish_reason"] is None  # cut off before the engine finished


@pytest.mark.parametrize("route, body, param", [
    # with the ids the proxy asks for, vLLM leaves the prompt out of `text`, and records prompt logprobs as the
    # completion's: refused rather than answered otherwise than the engine would answer the agent
    ("completions", {"prompt": "Once upon a time", "max_tokens": 4, "echo": True}, "echo"),
    # vLLM then withholds every id and logprob (with a tool parser on): nothing could be trained
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "include_reasoning": False},
     "include_reasoning"),
    # vLLM refuses these without logprobs; the proxy adds logprobs for itself, so it must refuse them first
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs"),
])
def test_requests_the_proxy_cannot_record_or_answer_as_the_engine_would_are_400(proxy_url, route, body, param):
    rollout_id = uuid.uuid4().hex
    response = requests.post(f"{proxy_url}/rollouts/{rollout_id}/v1/{route}", json={"model": "stub-model", **body})
    assert assert_openai_error(response, 400)["param"] == param
    assert recorded_calls(proxy_url, rollout_id) == []


def test_a_system_item_of_an_earlier_responses_turn_carries_over():
    """OpenAI carries a conversation's input items over `previous_response_id` (only `instructions` do not)."""
    from proxy.dialects.responses import RESPONSES

    history = [{"role": "system", "content": "Always answer in French."}, {"role": "user", "content": "hi"},
               {"role": "assistant", "content": "bonjour"}]
    chat = RESPONSES.to_chat({"model": "m", "input": "again"}, history)
    assert chat["messages"] == history + [{"role": "user", "content": "again"}]
