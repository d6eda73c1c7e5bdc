"""No request can stop the proxy from recording: bodies nested past what can be written again, huge bodies,
invalid UTF-8, lone surrogates and header bytes that are not UTF-8 are refused at the edge in the route's own
error shape, and the calls and rewards after them are recorded as usual. A real `rlproxy serve`, the stub
engine, Postgres."""
from __future__ import annotations

import uuid

import orjson
import pytest
import requests

from proxy.dialects.messages_objects import tool_input
from proxy.strict_json import MAX_JSON_DEPTH
from tests.support import running_proxy

LIMIT = 1 << 20  # the proxy under test takes bodies up to 1 MiB
USER = {"role": "user", "content": "What is 6 times 7?"}


def nested(depth: int):
    """Arrays `depth` levels deep, as a value that is written into a body as raw JSON text (`send`): past 254
    levels neither orjson nor Python's json module would write it."""
    return Deep(depth)


class Deep:
    def __init__(self, depth: int) -> None:
        self.depth = depth


def send(url: str, body: dict, **kwargs) -> requests.Response:
    """POST `body` as JSON, its `nested()` values written as raw text."""
    deep: list[Deep] = []

    def mark(value):
        deep.append(value)
        return f"__deep{len(deep) - 1}__"

    raw = orjson.dumps(body, default=mark)
    for index, value in enumerate(deep):
        raw = raw.replace(f'"__deep{index}__"'.encode(), b"[" * value.depth + b"]" * value.depth)
    return requests.post(url, data=raw, headers={"Content-Type": "application/json"}, **kwargs)


def chat(**extra) -> dict:
    return {"model": "stub-model", "max_tokens": 8, "messages": [USER], **extra}


@pytest.fixture(scope="module")
def proxy(stub_url, database_url, tmp_path_factory) -> str:
    workdir = tmp_path_factory.mktemp("poison")
    with running_proxy([stub_url], database_url, workdir, "proxy", "--client-max-size", str(LIMIT)) as url:
        yield url


def openai_error(response: requests.Response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert code is None or error["code"] == code, error
    return error


def anthropic_error(response: requests.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    return body["error"]


def test_nothing_a_request_holds_stops_the_recording(proxy):
    rollout = requests.post(f"{proxy}/rollouts", json={"task_id": "poison"}).json()["rollout_id"]
    base = f"{proxy}/rollouts/{rollout}/v1"
    answered = []  # call ids the proxy answered: each must be recorded

    def ok(response: requests.Response) -> None:
        assert response.status_code == 200, response.text
        answered.append(response.headers["X-Rlproxy-Call-Id"])

    # Nesting: the body itself is level 1, each message level 3.
    deepest = [{**USER, "x": nested(MAX_JSON_DEPTH - 3)}]
    ok(send(f"{base}/chat/completions", chat(messages=deepest)))
    for depth in (MAX_JSON_DEPTH - 2, 300, 1000):  # one level too many; past orjson's 254; near its 1024
        poison = chat(messages=[{**USER, "x": nested(depth)}])
        openai_error(send(f"{base}/chat/completions", poison), 400, "json_too_deep")
    openai_error(send(f"{base}/responses", {"model": "stub-model", "input": [nested(300)]}), 400,
                 "json_too_deep")
    tool_use = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "calc",
                                                  "input": {"x": nested(300)}}]}
    messages = {"model": "stub-model", "max_tokens": 8, "messages": [USER, tool_use]}
    anthropic_error(send(f"{proxy}/rollouts/{rollout}/v1/messages", messages), 400)
    openai_error(send(f"{proxy}/rollouts", {"metadata": {"x": nested(300)}}), 422, "json_too_deep")
    openai_error(send(f"{proxy}/reward", {"rollout_id": rollout, "reward": 1.0,
                                                        "metadata": {"x": nested(300)}}), 422, "json_too_deep")
    traces = send(f"{proxy}/v1/traces", {"resourceSpans": [nested(300)]})
    openai_error(traces, 400, "json_too_deep")

    # Tool arguments are text: any nesting in them is kept as it is, the agent's and the model's.
    arguments = "[" * 5000 + "]" * 5000  # past Python's recursion limit when parsed
    called = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": arguments}}]}
    ok(send(f"{base}/chat/completions", chat(messages=[USER, called])))
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    ok(send(f"{base}/chat/completions", chat(
        messages=[{"role": "user", "content": "use tool"}], tools=tools, stub_tool_arguments=arguments)))
    ok(send(f"{base}/chat/completions", chat()))  # automatic rewards read the call above
    assert tool_input("{" + '"a":{' * 300 + "}" * 301)["_raw"]  # an Anthropic tool_use input cannot nest so

    # Size: refused before it is read, in the route's own shape; a large body within the limit is served.
    big = chat(messages=[{"role": "user", "content": "x" * LIMIT}])
    openai_error(send(f"{base}/chat/completions", big), 413, "request_too_large")
    anthropic_error(requests.post(f"{base}/messages", json=big), 413)
    ok(send(f"{base}/chat/completions", chat(messages=[{"role": "user", "content": "x" * (LIMIT // 2)}])))

    # Text nothing downstream can hold.
    headers = {"Content-Type": "application/json"}
    for raw in (b'{"model": "stub-model", "max_tokens": 8, "messages": [{"role": "user", "content": "\xff"}]}',
                b'{"model": "stub-model", "max_tokens": 8, "messages": [{"role": "user", "content": "\\ud800"}]}',
                b'{"model": "stub-model", "max_tokens": 8, "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}'):
        openai_error(requests.post(f"{base}/chat/completions", data=raw, headers=headers), 400, "invalid_json")
        anthropic_error(requests.post(f"{base}/messages", data=raw, headers=headers), 400)
    reward = b'{"rollout_id": "%s", "reward": 1, "metadata": {"note": "\\udc00"}}' % rollout.encode()
    openai_error(requests.post(f"{proxy}/reward", data=reward, headers=headers), 422, "invalid_json")
    for header in ("X-Task-Id", "X-Agent-Name", "X-Rollout-Id"):  # sent as the byte 0xff, read as "\udcff"
        response = requests.post(f"{proxy}/v1/chat/completions", json=chat(), headers={header: "task\xff"})
        openai_error(response, 400, "invalid_id")

    # Everything answered is recorded, rewards work, and the proxy says it is ready.
    ok(send(f"{base}/chat/completions", chat()))
    assert requests.post(f"{proxy}/reward", json={"rollout_id": rollout, "reward": 1.0}, timeout=15).status_code == 200
    stored = requests.get(f"{proxy}/rollouts/{rollout}", timeout=15).json()
    assert [call["call_id"] for call in stored["calls"]] == answered
    assert [call["seq"] for call in stored["calls"]] == list(range(1, len(answered) + 1))
    assert stored["status"] == "finished" and stored["reward"] == 1.0
    ready = requests.get(f"{proxy}/readyz").json()
    assert ready["status"] == "ready" and ready["writer"] is True and ready["spool"]["durability"] == "spool"
    metrics = requests.get(f"{proxy}/metrics").text
    assert "rlproxy_capture_writer_running 1.0" in metrics
    assert "rlproxy_capture_writer_restarts_total 0.0" in metrics
    assert "rlproxy_capture_calls_rejected_total 0.0" in metrics


def test_a_task_id_may_be_any_text_a_header_can_carry(proxy):
    rollout = uuid.uuid4().hex
    response = requests.post(f"{proxy}/v1/chat/completions", json=chat(),
                             headers={"X-Rollout-Id": rollout, "X-Task-Id": "gsm8k/train/17 (é)".encode().decode("latin-1")})
    assert response.status_code == 200, response.text
    assert requests.get(f"{proxy}/rollouts/{rollout}", timeout=15).json()["task_id"] == "gsm8k/train/17 (é)"


@pytest.mark.parametrize("literal", [b"99999999999999999999999", b"18446744073709551615", b"-9223372036854775809"])
@pytest.mark.parametrize("route", ["chat/completions", "responses", "messages"])
def test_an_integer_past_64_bits_is_refused_not_sent_as_a_rounded_float(proxy, route, literal):
    """orjson reads such a literal as a float (or an unsigned int): a tool schema's `maximum` or a `seed` would
    have reached the engine as 1e+23, and the prompt the chat template renders would have changed with it."""
    body = {"chat/completions": b'{"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "seed": %s}',
            "responses": b'{"model": "stub-model", "input": "hi", "temperature": 1.0, "max_output_tokens": %s}',
            "messages": b'{"model": "stub-model", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], '
                        b'"tools": [{"name": "f", "input_schema": {"type": "object", "properties": {"n": '
                        b'{"type": "integer", "maximum": %s}}}}]}'}[route] % literal
    answer = requests.post(f"{proxy}/v1/{route}", data=body, headers={"Content-Type": "application/json"})
    if route == "messages":
        assert "beyond 64 bits" in anthropic_error(answer, 400)["message"]
    else:
        assert "beyond 64 bits" in openai_error(answer, 400, "number_too_large")["message"]


def test_large_numbers_within_64_bits_and_digits_in_text_pass(proxy):
    body = (b'{"model": "stub-model", "max_tokens": 8, "seed": 9223372036854775807, "temperature": 1.0, '
            b'"messages": [{"role": "user", "content": "99999999999999999999999 is a big number"}]}')
    answer = requests.post(f"{proxy}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 200, answer.text
