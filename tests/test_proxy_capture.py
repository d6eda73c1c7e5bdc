"""The capture proxy as an agent uses it: the real `openai` SDK pointed at `rlproxy serve` (a real process)
in front of the vLLM-like stub engine, recording into real Postgres."""
from __future__ import annotations

import json
import re
import uuid

import openai
import pytest
import requests

from testkit.stub_engine import EOS_ID, render_chat, tokenize

MESSAGES = [{"role": "user", "content": "What is 6 times 7?"}]
TOOL_MESSAGES = [{"role": "user", "content": "use tool please"}]
TOOLS = [{"type": "function", "function": {"name": "calculate", "parameters": {"type": "object"}}}]


def new_rollout(proxy_url: str, **body) -> tuple[str, str]:
    response = requests.post(f"{proxy_url}/rollouts", json=body)
    assert response.status_code == 201, response.text
    data = response.json()
    return data["rollout_id"], data["base_url"]


def rollout(proxy_url: str, rollout_id: str) -> dict:
    response = requests.get(f"{proxy_url}/rollouts/{rollout_id}")
    assert response.status_code == 200, response.text
    return response.json()


def test_agent_changes_only_base_url_and_every_call_is_recorded_exactly(proxy_url):
    rollout_id, base_url = new_rollout(proxy_url, task_id="math-1", agent="solver")
    assert base_url == f"{proxy_url}/rollouts/{rollout_id}/v1"
    client = openai.OpenAI(base_url=base_url, api_key="unused")

    raw = client.chat.completions.with_raw_response.create(model="stub-model", messages=MESSAGES, seed=1)
    completion = raw.parse()

    # The agent sees what it asked for: no logprobs or token ids it did not request.
    assert completion.choices[0].logprobs is None
    assert getattr(completion.choices[0], "token_ids", None) is None
    assert getattr(completion, "prompt_token_ids", None) is None
    assert completion.model == "stub-model"
    call_id = raw.headers["X-Rlproxy-Call-Id"]
    assert raw.headers["X-Rlproxy-Policy"] == "0"

    reward = requests.post(f"{proxy_url}/reward", json={"rollout_id": rollout_id, "reward": 1.0})
    assert reward.status_code == 200 and reward.json() == {"rollout_id": rollout_id, "reward": 1.0}

    data = rollout(proxy_url, rollout_id)
    assert data["status"] == "finished" and data["reward"] == 1.0 and data["task_id"] == "math-1"
    [call] = data["calls"]
    assert call["call_id"] == call_id and call["seq"] == 1 and call["status"] == "ok"
    assert call["prompt_token_ids"] == tokenize(render_chat(MESSAGES))
    text = completion.choices[0].message.content
    assert call["completion_token_ids"] == tokenize(text) + [EOS_ID]
    assert len(call["completion_logprobs"]) == len(call["completion_token_ids"])
    assert call["request"] == {"model": "stub-model", "messages": MESSAGES, "seed": 1}
    assert call["response"]["choices"][0]["message"]["content"] == text
    assert call["latency_ms"] > 0
    assert [r["kind"] for r in data["rewards"]] == ["final"]


def test_streaming_relays_chunks_and_records_the_same_ids_as_non_streaming(proxy_url):
    rollout_id, base_url = new_rollout(proxy_url)
    client = openai.OpenAI(base_url=base_url, api_key="unused")

    whole = client.chat.completions.create(model="stub-model", messages=MESSAGES, seed=7)
    stream = client.chat.completions.create(model="stub-model", messages=MESSAGES, seed=7, stream=True)
    chunks = list(stream)
    streamed_text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    assert streamed_text == whole.choices[0].message.content
    assert all(c.choices[0].logprobs is None for c in chunks if c.choices)
    first, second = rollout(proxy_url, rollout_id)["calls"]
    assert second["prompt_token_ids"] == first["prompt_token_ids"]
    assert second["completion_token_ids"] == first["completion_token_ids"]
    assert second["completion_logprobs"] == pytest.approx(first["completion_logprobs"])
    assert second["response"]["choices"][0]["message"]["content"] == streamed_text
    assert second["finish_reason"] == "stop"


def _normalise(body: bytes) -> bytes:
    """Ids and timestamps differ between any two engine answers; everything else must not."""
    body = re.sub(rb'"(chatcmpl|cmpl)-[0-9a-f]+"', b'"ID"', body)
    return re.sub(rb'"created":\d+', b'"created":0', body)


@pytest.mark.parametrize("route,payload", [
    ("chat/completions", {"messages": MESSAGES, "seed": 3}),
    ("chat/completions", {"messages": MESSAGES, "seed": 3, "stream": True}),
    ("chat/completions", {"messages": MESSAGES, "n": 2, "response_format": {"type": "json_object"}}),
    ("chat/completions", {"messages": MESSAGES, "logprobs": True, "top_logprobs": 0}),
    ("chat/completions", {"messages": MESSAGES, "logprobs": True, "return_token_ids": True, "stream": True}),
    # the agent asked for one of the two: the engine sends it the empty deltas of a tool call's tokens too (they
    # have no text), and the proxy, having added only the other, must relay them; asked for neither, it skips them
    ("chat/completions", {"messages": TOOL_MESSAGES, "tools": TOOLS, "logprobs": True, "stream": True}),
    ("chat/completions", {"messages": TOOL_MESSAGES, "tools": TOOLS, "return_token_ids": True, "stream": True}),
    ("chat/completions", {"messages": TOOL_MESSAGES, "tools": TOOLS, "stream": True}),
    ("completions", {"prompt": "Once upon a time", "max_tokens": 5}),
    ("completions", {"prompt": "Once upon a time", "max_tokens": 5, "stream": True}),
])
def test_what_the_agent_receives_is_byte_for_byte_what_the_engine_returns(proxy_url, stub_url, route, payload):
    body = {"model": "stub-model", **payload}
    direct = requests.post(f"{stub_url}/v1/{route}", json=body)
    proxied = requests.post(f"{proxy_url}/rollouts/{uuid.uuid4().hex}/v1/{route}", json=body)
    assert proxied.status_code == direct.status_code == 200
    assert _normalise(proxied.content) == _normalise(direct.content)


def test_tool_call_round_trip_is_recorded_and_linked(proxy_url):
    rollout_id, base_url = new_rollout(proxy_url)
    client = openai.OpenAI(base_url=base_url, api_key="unused")
    tools = [{"type": "function", "function": {"name": "calculate", "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "use tool to compute 6*7"}]

    first = client.chat.completions.create(model="stub-model", messages=messages, tools=tools)
    tool_call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls" and tool_call.function.name == "calculate"
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": tool_call.id, "content": "42"}]
    client.chat.completions.create(model="stub-model", messages=messages, tools=tools)

    calls = rollout(proxy_url, rollout_id)["calls"]
    assert [c["seq"] for c in calls] == [1, 2]
    assert calls[0]["response"]["choices"][0]["message"]["tool_calls"][0]["id"] == tool_call.id
    assert calls[1]["request"]["messages"][-1]["tool_call_id"] == tool_call.id


def test_streamed_tool_calls_are_assembled(proxy_url):
    rollout_id, base_url = new_rollout(proxy_url)
    client = openai.OpenAI(base_url=base_url, api_key="unused")
    tools = [{"type": "function", "function": {"name": "calculate", "parameters": {"type": "object"}}}]
    list(client.chat.completions.create(model="stub-model", stream=True, tools=tools,
                                        messages=[{"role": "user", "content": "use tool please"}]))
    [call] = rollout(proxy_url, rollout_id)["calls"]
    [tool_call] = call["response"]["choices"][0]["message"]["tool_calls"]
    assert tool_call["function"] == {"name": "calculate", "arguments": json.dumps({"expression": "6*7"})}
    assert call["finish_reason"] == "tool_calls"


def test_multi_turn_calls_record_an_exact_prefix_link(proxy_url):
    rollout_id, base_url = new_rollout(proxy_url)
    client = openai.OpenAI(base_url=base_url, api_key="unused")
    messages = [{"role": "user", "content": "hello"}]
    answer = client.chat.completions.create(model="stub-model", messages=messages).choices[0].message.content
    messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "and again"}]
    client.chat.completions.create(model="stub-model", messages=messages)
    # The agent rewrites its own last answer before sending it back: the completion is no longer a prefix.
    messages += [{"role": "assistant", "content": "(summarised)"}, {"role": "user", "content": "more"}]
    client.chat.completions.create(model="stub-model", messages=messages)
    # A fresh conversation inside the same rollout: not even the previous prompt is a prefix.
    client.chat.completions.create(model="stub-model", messages=[{"role": "user", "content": "new topic"}])

    first, second, third, fourth = rollout(proxy_url, rollout_id)["calls"]
    assert first["prefix_kind"] == "first" and first["prefix_parent_id"] is None
    assert second["prefix_kind"] == "extends" and second["prefix_parent_id"] == first["call_id"]
    head = first["prompt_token_ids"] + first["completion_token_ids"]
    assert second["prompt_token_ids"][: len(head)] == head
    assert third["prefix_kind"] == "retokenized" and third["prefix_parent_id"] == second["call_id"]
    assert fourth["prefix_kind"] == "diverged"


def test_rollout_from_header_and_agent_from_path(proxy_url):
    rollout_id = uuid.uuid4().hex
    client = openai.OpenAI(base_url=f"{proxy_url}/rollouts/{rollout_id}/agents/planner/v1", api_key="unused")
    client.chat.completions.create(model="stub-model", messages=MESSAGES)
    by_header = openai.OpenAI(base_url=f"{proxy_url}/v1", api_key="unused",
                              default_headers={"X-Rollout-Id": rollout_id, "X-Agent-Name": "critic"})
    by_header.chat.completions.create(model="stub-model", messages=MESSAGES)

    calls = rollout(proxy_url, rollout_id)["calls"]
    assert [c["agent"] for c in calls] == ["planner", "critic"]


def test_calls_without_a_rollout_are_served(proxy_url):
    client = openai.OpenAI(base_url=f"{proxy_url}/v1", api_key="unused")
    raw = client.chat.completions.with_raw_response.create(model="stub-model", messages=MESSAGES)
    assert raw.parse().choices[0].message.content
    assert raw.headers["X-Rlproxy-Call-Id"]
    models = client.models.list()
    assert [m.id for m in models.data][0] == "stub-model"


def test_async_client_with_concurrent_rollouts(proxy_url):
    import asyncio

    async def episode(index: int) -> tuple[str, int]:
        rollout_id, base_url = new_rollout(proxy_url, task_id=f"t{index % 2}")
        client = openai.AsyncOpenAI(base_url=base_url, api_key="unused")
        for _ in range(3):
            await client.chat.completions.create(model="stub-model", messages=MESSAGES)
        await client.close()
        return rollout_id, 3

    async def main():
        return await asyncio.gather(*(episode(i) for i in range(8)))

    for rollout_id, count in asyncio.run(main()):
        assert [c["seq"] for c in rollout(proxy_url, rollout_id)["calls"]] == list(range(1, count + 1))


def test_a_failing_tool_result_becomes_an_automatic_intermediate_reward(proxy_url):
    rollout_id, base_url = new_rollout(proxy_url)
    client = openai.OpenAI(base_url=base_url, api_key="unused")
    tools = [{"type": "function", "function": {"name": "calculate", "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "use tool to compute 1/0"}]
    first = client.chat.completions.create(model="stub-model", messages=messages, tools=tools)
    tool_call = first.choices[0].message.tool_calls[0]
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": tool_call.id, "content": "Error: division by zero"}]
    client.chat.completions.create(model="stub-model", messages=messages, tools=tools)
    client.chat.completions.create(model="stub-model", messages=messages, tools=tools)  # a retry: scored once

    data = rollout(proxy_url, rollout_id)
    [air] = [r for r in data["rewards"] if r["kind"] == "air"]
    assert air["call_id"] == data["calls"][0]["call_id"]
    assert air["reason"] == "tool_error" and air["value"] < 0
    metrics = requests.get(f"{proxy_url}/metrics").text
    assert 'rlproxy_rewards_total{kind="air",policy="0",reason="tool_error"}' in metrics


def test_a_call_air_cannot_score_is_stored_all_the_same(proxy_url, run_dir):
    """AIR is a bonus on the record: a body its rules did not foresee (here `tools` that is not a list, which
    this engine answers anyway) costs the call its automatic rewards, never its place in the store."""
    def air_errors() -> float:
        metrics = requests.get(f"{proxy_url}/metrics").text
        found = re.search(r'^rlproxy_air_errors_total\{stage="score"\} (\S+)$', metrics, re.MULTILINE)
        return float(found.group(1)) if found else 0.0

    before = air_errors()
    rollout_id, base_url = new_rollout(proxy_url)
    answer = requests.post(f"{base_url}/chat/completions", json={"model": "stub-model", "messages": MESSAGES,
                                                                 "tools": 5})
    assert answer.status_code == 200, answer.text

    data = rollout(proxy_url, rollout_id)
    assert [c["call_id"] for c in data["calls"]] == [answer.headers["X-Rlproxy-Call-Id"]]
    assert data["calls"][0]["request"]["tools"] == 5 and data["rewards"] == []
    rejected = run_dir / "proxy-spool.rejected.jsonl"
    assert not rejected.exists() or rollout_id not in rejected.read_text()
    assert air_errors() == before + 1


def test_a_whole_body_written_again_keeps_the_engines_way_of_writing_numbers():
    """vLLM writes a whole body with `json.dumps` (`-1e-05`), its stream chunks with pydantic (`-0.00001`, as
    orjson). A whole body whose added logprobs the proxy strips is written again: as the engine writes it, so
    the floats the agent did ask for (here its prompt logprobs) read byte for byte as the engine sent them."""
    import json

    from proxy.capture import Additions, relay_bytes

    engine_sent = {"id": "chatcmpl-1", "object": "chat.completion", "model": "m",
                   "prompt_logprobs": [None, {"42": {"logprob": -1e-05, "rank": 1, "decoded_token": "é"}}],
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                "logprobs": {"content": [{"token": "hi", "logprob": -2.5e-07}]},
                                "finish_reason": "stop", "token_ids": [7]}]}
    raw = json.dumps(engine_sent, ensure_ascii=False, separators=(",", ":")).encode()
    relayed = relay_bytes(raw, json.loads(raw), Additions(True, True, "m", "m"), whole=True)
    assert b'"logprob":-1e-05' in relayed and b'"decoded_token":"\xc3\xa9"' in relayed
    assert json.loads(relayed)["choices"][0]["logprobs"] is None and json.loads(relayed)["choices"][0]["token_ids"] is None
