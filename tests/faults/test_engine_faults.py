"""Engine-side faults seen through the real `openai` SDK (tests/api/test_proxy_errors.py covers an engine
that closes a stream while it keeps running, and the recorded partial call of a client that leaves): here the
engine process dies mid-stream and comes back, and a client that leaves mid-stream makes the proxy let go of
the engine's request at once."""
from __future__ import annotations

import os
import signal
import time
import uuid

import openai
import pytest
import requests

from tests.faults.relay import Relay
from tests.faults.probes import wait_until
from tests.support import free_port, running, running_proxy, stub_command

MESSAGES = [{"role": "user", "content": "Tell me a story."}]


def agent(proxy_url: str, rollout_id: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy_url}/rollouts/{rollout_id}/v1", api_key="unused", max_retries=0)


def recorded_call(proxy_url: str, rollout_id: str) -> dict:
    url = f"{proxy_url}/rollouts/{rollout_id}"
    calls = wait_until(lambda: requests.get(url, timeout=10).json().get("calls"), timeout=10)
    [call] = calls
    return call


def test_engine_killed_mid_stream_then_back(database_url, tmp_path):
    port = free_port()
    engine = f"http://127.0.0.1:{port}"
    with running(stub_command(port), engine + "/health", log_path=tmp_path / "stub.log") as stub, \
         running_proxy([engine], database_url, tmp_path) as proxy_url:
        rollout_id = uuid.uuid4().hex
        client = agent(proxy_url, rollout_id)
        stream = client.chat.completions.create(model="stub-model", messages=MESSAGES, stream=True,
                                                extra_body={"stub_delay": 0.5})
        received = []
        with pytest.raises(openai.APIError) as raised:
            for chunk in stream:
                received.append(chunk)
                if chunk.choices and chunk.choices[0].delta.content:
                    os.killpg(stub.pid, signal.SIGKILL)  # the engine dies mid-answer
        assert "engine connection lost mid-stream" in raised.value.message
        error = raised.value.body
        assert error == dict(error, type="upstream_error", code="upstream_unavailable")
        call = recorded_call(proxy_url, rollout_id)
        assert call["status"] == "upstream_error" and 1 <= len(call["completion_token_ids"]) < len(received)

        with pytest.raises(openai.InternalServerError) as down:  # no engine: an OpenAI-shaped 502 at once
            client.chat.completions.create(model="stub-model", messages=MESSAGES)
        assert down.value.status_code == 502 and down.value.body["code"] == "upstream_unavailable"
        assert requests.get(proxy_url + "/readyz", timeout=10).status_code == 503

        with running(stub_command(port), engine + "/health", log_path=tmp_path / "stub.log"):  # back
            answer = client.chat.completions.create(model="stub-model", messages=MESSAGES)
            streamed = list(client.chat.completions.create(model="stub-model", messages=MESSAGES,
                                                           stream=True))
            assert answer.choices[0].finish_reason == "stop"
            assert streamed[-1].choices[0].finish_reason == "stop"
            assert requests.get(proxy_url + "/readyz", timeout=10).status_code == 200


def test_a_client_leaving_mid_stream_cancels_the_engine_request(stub_url, database_url, tmp_path):
    with Relay(int(stub_url.rsplit(":", 1)[1])) as relay, \
         running_proxy([relay.url], database_url, tmp_path) as proxy_url:
        rollout_id = uuid.uuid4().hex
        client = agent(proxy_url, rollout_id)
        # The stub sends one chunk a second: the whole answer would take at least five.
        stream = client.chat.completions.create(model="stub-model", messages=MESSAGES, stream=True,
                                                extra_body={"stub_delay": 1.0})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                break
        stream.close()  # the agent goes away
        left = time.monotonic()
        [link] = relay.streams()
        wait_until(lambda: link.closed_at is not None, timeout=3, every=0.05)
        print(f"\nengine request released {link.closed_at - left:.2f} s after the client left")
        assert link.closed_at - left < 2.0
        received = link.received
        time.sleep(1.5)
        assert link.received == received  # nothing more came from the engine
        call = recorded_call(proxy_url, rollout_id)
        assert call["status"] == "client_disconnected" and call["finish_reason"] is None
        assert len(call["completion_token_ids"]) >= 1  # the part the agent saw is recorded
