"""A key's open requests are bounded (`--max-open-per-key`), streams included: the rate limit counts requests as
they start, so 2 requests/s held 30 streams open. Past the bound: 429 in the route's format with Retry-After,
and the next request once one ends is served."""
from __future__ import annotations

import time

import requests

from testkit.stub_engine import BASE_MODEL
from tests.support import make_key, running_proxy

CHAT = [{"role": "user", "content": "What is 6*7?"}]


def slow_stream(url: str, key: str) -> requests.Response:
    body = {"model": BASE_MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 8,
            "stub_delay": 0.5}  # eight tokens, half a second each
    answer = requests.post(f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"},
                           stream=True, timeout=30)
    assert answer.status_code == 200  # open: its head came, its events are on their way
    return answer


def test_a_key_may_hold_only_so_many_streams_open(stub_url, own_database_url, tmp_path):
    alpha, beta = make_key(own_database_url, "alpha"), make_key(own_database_url, "beta")
    with running_proxy([stub_url], own_database_url, tmp_path, "streams", "--max-open-per-key", "2",
                       "--rate-limit", "100") as url:
        streams = [slow_stream(url, alpha), slow_stream(url, alpha)]
        refused = requests.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {alpha}"},
                                json={"model": BASE_MODEL, "messages": CHAT}, timeout=10)
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
        assert refused.json()["error"]["code"] == "too_many_open_requests"
        messages = requests.post(f"{url}/v1/messages", headers={"x-api-key": alpha},
                                 json={"model": BASE_MODEL, "max_tokens": 8, "messages": CHAT}, timeout=10)
        assert messages.status_code == 429 and messages.json()["type"] == "error"  # Anthropic's shape there
        assert requests.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {beta}"},
                             json={"model": BASE_MODEL, "messages": CHAT}, timeout=10).status_code == 200
        streams[0].close()
        deadline = time.monotonic() + 10
        while True:  # the proxy sees the stream end at its next write
            again = requests.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {alpha}"},
                                  json={"model": BASE_MODEL, "messages": CHAT}, timeout=10)
            if again.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert again.status_code == 200
        streams[1].close()
