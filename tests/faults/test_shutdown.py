"""Graceful shutdown of a real `rlproxy serve`: on SIGTERM it stops accepting connections, lets the streams in
flight finish (up to `--shutdown-timeout`), stores their calls, and exits."""
from __future__ import annotations

import os
import signal
import time
import uuid

import openai
import psycopg
import pytest
import requests

from tests.faults.probes import wait_until
from tests.faults.traffic import libpq
from tests.support import free_port, proxy_command, running

MESSAGES = [{"role": "user", "content": "Tell me a story."}]


def start_stream(base_url: str, delay: float):
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model="stub-model", messages=MESSAGES, stream=True,
                                                           extra_body={"stub_delay": delay})
    stream = iter(raw.parse())
    first = next(chunk for chunk in stream if chunk.choices and chunk.choices[0].delta.content)
    return raw.headers["x-rlproxy-call-id"], first, stream


def refuses_connections(url: str) -> bool:
    try:
        requests.get(url + "/healthz", timeout=1)
    except requests.ConnectionError:
        return True
    return False


def stored_call(database_url: str, call_id: str):
    with psycopg.connect(libpq(database_url)) as conn:
        return conn.execute("SELECT status, completion_tokens FROM calls WHERE id = %s",
                            (call_id,)).fetchone()


def proxy(stub_url: str, database_url: str, tmp_path, *extra: str):
    port = free_port()
    args = proxy_command(port, [stub_url], database_url, "--spool-path", str(tmp_path / "spool.jsonl"),
                         *extra)
    url = f"http://127.0.0.1:{port}"
    return running(args, url + "/healthz", log_path=tmp_path / "proxy.log"), url


def test_sigterm_lets_a_stream_in_flight_finish_and_records_it(stub_url, database_url, tmp_path):
    server, url = proxy(stub_url, database_url, tmp_path)
    with server as process:
        call_id, first, stream = start_stream(f"{url}/rollouts/{uuid.uuid4().hex}/v1", delay=0.4)
        os.killpg(process.pid, signal.SIGTERM)
        wait_until(lambda: refuses_connections(url), timeout=3, every=0.05)  # no new connections
        rest = list(stream)  # the stream in flight goes on to its end
        assert rest[-1].choices[0].finish_reason == "stop"
        assert process.wait(10) == 0
    status, completion_tokens = stored_call(database_url, call_id)
    assert status == "ok" and completion_tokens == 1 + len(rest)  # (the first chunk carried one token)
    log = (tmp_path / "proxy.log").read_text()
    assert "shutting down: 1 requests in flight" in log and "stopped" in log
    assert not (tmp_path / "spool.jsonl").exists()


def test_a_stream_longer_than_the_shutdown_timeout_is_cut_and_still_recorded(stub_url, database_url,
                                                                             tmp_path):
    server, url = proxy(stub_url, database_url, tmp_path, "--shutdown-timeout", "1")
    with server as process:
        call_id, first, stream = start_stream(f"{url}/rollouts/{uuid.uuid4().hex}/v1", delay=1.5)
        os.killpg(process.pid, signal.SIGTERM)
        stopped = time.monotonic()
        with pytest.raises(openai.APIConnectionError):  # the answer is cut off: it would have taken seconds
            list(stream)
        assert process.wait(10) == 0
        assert time.monotonic() - stopped < 5
    status, completion_tokens = stored_call(database_url, call_id)
    assert status == "client_disconnected" and completion_tokens >= 1
