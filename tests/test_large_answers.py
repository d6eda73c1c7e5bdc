"""One call with many choices: refused past the default `--max-n`, and where an operator allows it, captured off
the event loop, so the proxy's other requests (`/healthz`, every other tenant's calls) are answered meanwhile."""
from __future__ import annotations

import threading
import time
import uuid

import requests

from core.settings import AuthSettings
from testkit.stub_engine import BASE_MODEL
from tests.support import running_proxy

CHAT = [{"role": "user", "content": "What is 6*7?"}]


def test_n_is_bounded_by_default(proxy_url):
    default = AuthSettings().max_n
    body = {"model": BASE_MODEL, "messages": CHAT, "max_tokens": 2}
    refused = requests.post(f"{proxy_url}/v1/chat/completions", json={**body, "n": default + 1}, timeout=30)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "n"
    allowed = requests.post(f"{proxy_url}/v1/chat/completions", json={**body, "n": 2}, timeout=30)
    assert allowed.status_code == 200 and len(allowed.json()["choices"]) == 2


def slowest_health_answer_during(url: str, call) -> tuple[float, object]:
    """The longest `/healthz` took while `call()` ran in another thread and for a second after (while the call is
    stored), asked every 20 ms."""
    result: dict = {}
    worker = threading.Thread(target=lambda: result.setdefault("answer", call()))
    slowest = 0.0
    worker.start()
    time.sleep(0.3)  # the engine is making the answer meanwhile (the stub: a second or so)
    after = None
    while after is None or time.monotonic() < after:
        if after is None and not worker.is_alive():
            after = time.monotonic() + 1.0
        began = time.perf_counter()
        assert requests.get(f"{url}/healthz", timeout=30).status_code == 200
        slowest = max(slowest, time.perf_counter() - began)
        time.sleep(0.02)
    worker.join()
    return slowest, result["answer"]


def test_a_call_of_thousands_of_choices_does_not_hold_the_other_requests(stub_url, database_url, tmp_path):
    n = 20000
    with running_proxy([stub_url], database_url, tmp_path, "many-choices", "--max-n", str(n)) as url:
        body = {"model": BASE_MODEL, "messages": CHAT, "max_tokens": 4, "n": n}
        rollout = uuid.uuid4().hex
        slowest, answer = slowest_health_answer_during(
            url, lambda: requests.post(f"{url}/rollouts/{rollout}/v1/chat/completions", json=body, timeout=120))
    assert answer.status_code == 200 and len(answer.json()["choices"]) == n
    # On the idle 2-core test machine: 0.58 s with the answer captured and its choices stored on the event loop,
    # 0.37-0.40 s with both off it (what is left: the call's row, its bodies as JSON, and its AIR scoring); under a
    # load of 9 on its two cores, 1.8 s. The bound is for a loaded machine: what keeps such calls away is the
    # default --max-n (test_n_is_bounded_by_default).
    assert slowest < 3.0, slowest
