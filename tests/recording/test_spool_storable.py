"""Every call an agent got an answer for is in its rollout, whatever text it held: a real `rlproxy serve` in front
of the stand-in engine, recording into Postgres, which refuses NUL characters and names longer than a column."""
from __future__ import annotations

import time

import requests


def rollout_calls(proxy: str, rollout_id: str, expected: int) -> list[dict]:
    for _ in range(100):  # the writer stores a batch every few milliseconds
        calls = requests.get(f"{proxy}/rollouts/{rollout_id}").json()["calls"]
        if len(calls) >= expected:
            return calls
        time.sleep(0.05)
    return calls


def test_a_call_with_a_nul_or_an_overlong_model_name_is_recorded(proxy_url):
    rollout_id = requests.post(f"{proxy_url}/rollouts", json={"task_id": "binary-tool-output"}).json()["rollout_id"]
    base = f"{proxy_url}/rollouts/{rollout_id}/v1"
    binary = {"model": "stub-model", "max_tokens": 8, "messages": [
        {"role": "user", "content": "what is in the file?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "cat", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "\x7fELF\x02\x01\x01\x00\x00\x00"}]}
    answered = requests.post(f"{base}/chat/completions", json=binary)
    unknown = requests.post(f"{base}/chat/completions", json={**binary, "model": "m" * 300})
    assert answered.status_code == 200 and unknown.status_code == 404

    calls = rollout_calls(proxy_url, rollout_id, 2)
    assert [(c["call_id"], c["seq"]) for c in calls] == [
        (answered.headers["X-Rlproxy-Call-Id"], 1), (unknown.headers["X-Rlproxy-Call-Id"], 2)]
    assert calls[0]["request"]["messages"][2]["content"] == "\x7fELF\x02\x01\x01\ufffd\ufffd\ufffd"
    assert calls[0]["status"] == "ok" and calls[0]["completion_token_ids"] and calls[0]["completion_logprobs"]
    assert calls[1]["status"] == "upstream_error" and calls[1]["model"] == "m" * 255 + "…"
