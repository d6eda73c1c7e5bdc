"""What reaches the proxy before any route does, and what a careless or hostile client sends there: a request that
is not HTTP is answered without its bytes, a slow sender is cut off while another tenant is served, an unrouted
path is not invited to send its body, a bad compressed body and oversized ids get the route's own answer, and
nothing of them is stored. Against `rlproxy serve` with keys on, in front of the stand-in engine, on raw sockets
where a client library would not send the form."""
from __future__ import annotations

import asyncio
import gzip
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import base64
import json

import pytest
import requests
from sqlalchemy import func, select

from store.models import Rollout
from testkit.stub_engine import BASE_MODEL, Stub
from tests.support import (REFUSED_MARK, free_port, fresh_database, make_key, proxy_command, refuse_marked_calls, running,
                           transaction)
from tests.tenants import engine_in_thread

TIMEOUT = 2.0  # --header-timeout and --body-timeout of this proxy
REJECTED_MAX = 64 * 1024  # --rejected-max-bytes


@dataclass
class Proxy:
    url: str
    port: int
    key: str  # an agent key of project alpha
    victim: str  # an agent key of project beta
    database_url: str
    log: Path
    spool: Path

    def headers(self, **more: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}", **more}

    def logged(self) -> str:
        return self.log.read_text(errors="replace")

    def rollouts_stored(self) -> int:
        async def count() -> int:
            async with transaction(self.database_url) as session:
                return (await session.execute(select(func.count()).select_from(Rollout))).scalar_one()
        return asyncio.run(count())


@pytest.fixture(scope="module")
def proxy(postgres_server: str, tmp_path_factory) -> Iterator[Proxy]:
    workdir = tmp_path_factory.mktemp("edge")
    with engine_in_thread(Stub(BASE_MODEL)) as engine_url, fresh_database(postgres_server) as database_url:
        keys = [make_key(database_url, project) for project in ("alpha", "beta")]
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        args = proxy_command(port, [engine_url], database_url, "--auth", "on", "--spool-path",
                             str(workdir / "spool.jsonl"), "--header-timeout", str(TIMEOUT),
                             "--body-timeout", str(TIMEOUT), "--rejected-max-bytes", str(REJECTED_MAX))
        with running(args, url + "/healthz", log_path=workdir / "proxy.log"):
            yield Proxy(url, port, *keys, database_url, workdir / "proxy.log", workdir / "spool.jsonl")


def exchange(proxy: Proxy, data: bytes, wait: float = 1.0) -> bytes:
    """Send `data` on a new connection and read what comes back within `wait` seconds, or until it is closed."""
    with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
        sock.sendall(data)
        sock.settimeout(wait)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except TimeoutError:
            pass
    return answer


# -- a request that is not HTTP ---------------------------------------------------------------------------------
@pytest.mark.parametrize("head", [
    b"GET /v1/models HTTP/1.1 trailing\r\nHost: proxy\r\nAuthorization: Bearer KEY\r\n\r\n",  # bad request line
    b"GET /v1/models HTTP/1.1\nHost: proxy\nAuthorization: Bearer KEY\n\n",  # bare LF
    b"GET /v1/models HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer KEY\r\nBad Header: 1\r\n\r\n",  # invalid name
    b"GET /v1/models HTTP/1.1\r\nHost: proxy\r\nx-api-key: KEY\r\nX-Long: " + b"0" * 9000 + b"\r\n\r\n",  # too long
], ids=["request-line", "bare-lf", "header-name", "over-long-header"])
def test_a_request_that_is_not_http_is_answered_without_any_of_its_bytes(proxy: Proxy, head: bytes):
    answer = exchange(proxy, head.replace(b"KEY", proxy.key.encode()))
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.0 400") or status.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"application/json" in status
    assert b'"code":"malformed_http_request"' in body and b"not valid HTTP/1.1" in body
    assert proxy.key.encode() not in answer and b"Authorization" not in body and b"/v1/models" not in body
    assert proxy.key not in proxy.logged()


# -- slow senders -----------------------------------------------------------------------------------------------
def drip(proxy: Proxy, first: bytes, then: bytes, seconds: float = 4 * TIMEOUT) -> tuple[float, bytes]:
    """Send `first`, then `then` every 0.2 s, for up to `seconds`: when the proxy closed the connection, and what
    it answered."""
    sock = socket.create_connection(("127.0.0.1", proxy.port))
    sock.settimeout(0.2)
    began, answer = time.monotonic(), b""
    sock.sendall(first)
    try:
        while time.monotonic() - began < seconds:
            sock.sendall(then)
            try:
                chunk = sock.recv(4096)
            except TimeoutError:
                continue
            if not chunk:
                break
            answer += chunk
    except OSError:  # reset: it was closed while we sent
        pass
    finally:
        sock.close()
    return time.monotonic() - began, answer


def test_a_slow_sender_is_cut_off_while_another_tenant_is_served(proxy: Proxy):
    key = proxy.key.encode()
    ends: dict[str, tuple[float, bytes]] = {}
    senders = [
        threading.Thread(target=lambda: ends.__setitem__("head", drip(
            proxy, b"POST /rollouts HTTP/1.1\r\nHost: proxy\r\n", b"X-Slow: 1\r\n"))),
        threading.Thread(target=lambda: ends.__setitem__("body", drip(
            proxy, b"POST /rollouts HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer " + key + b"\r\n"
                   b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{", b" "))),
    ]
    for sender in senders:
        sender.start()
    time.sleep(0.5)
    began = time.monotonic()
    served = requests.post(f"{proxy.url}/rollouts", json={}, timeout=10,
                           headers={"Authorization": f"Bearer {proxy.victim}"})
    assert served.status_code == 201 and time.monotonic() - began < 1.0
    for sender in senders:
        sender.join()
    head_seconds, _ = ends["head"]
    body_seconds, body_answer = ends["body"]
    # cut off after about the timeout (aiohttp checks a head's time with a coarse timer), long before 4x
    assert TIMEOUT * 0.9 < head_seconds < 3 * TIMEOUT
    assert TIMEOUT * 0.9 < body_seconds < 3 * TIMEOUT
    assert body_answer.startswith(b"HTTP/1.1 408") and b'"code":"request_timeout"' in body_answer
    assert b"Connection: close" in body_answer


# -- Expect on a path no route takes ----------------------------------------------------------------------------
@pytest.mark.parametrize("line, with_key, status", [
    (b"POST /not-a-route HTTP/1.1", True, b"404"),
    (b"POST /not-a-route HTTP/1.1", False, b"401"),
    (b"PUT /v1/chat/completions HTTP/1.1", True, b"405"),
])
def test_a_path_no_route_takes_is_not_invited_to_send_its_body(proxy: Proxy, line: bytes, with_key: bool,
                                                              status: bytes):
    key = b"Authorization: Bearer " + proxy.key.encode() + b"\r\n" if with_key else b""
    answer = exchange(proxy, line + b"\r\nHost: proxy\r\n" + key + b"Content-Length: 1000000\r\n"
                             b"Expect: 100-continue\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 " + status), answer[:200]
    assert b"100 Continue" not in answer and b"Connection: close" in answer


# -- a compressed body that is not what it says -----------------------------------------------------------------
def test_a_bad_gzip_body_gets_the_routes_malformed_body_status(proxy: Proxy):
    rollout = requests.post(f"{proxy.url}/rollouts", json={}, headers=proxy.headers(), timeout=10).json()
    statuses = {}
    for path in ("/rollouts", "/reward", f"/rollouts/{rollout['rollout_id']}/events", "/v1/chat/completions"):
        answer = requests.post(proxy.url + path, data=b"this is not gzip", timeout=10, headers=proxy.headers(
            **{"Content-Encoding": "gzip", "Content-Type": "application/json"}))
        assert answer.json()["error"]["code"] == "invalid_body"
        statuses[path.replace(rollout["rollout_id"], "{id}")] = answer.status_code
    # as a malformed JSON body on each: 422 on the rollout routes, 400 on the OpenAI ones
    assert statuses == {"/rollouts": 422, "/reward": 422, "/rollouts/{id}/events": 422, "/v1/chat/completions": 400}
    good = requests.post(f"{proxy.url}/rollouts", data=gzip.compress(b'{"task_id": "zipped"}'), timeout=10,
                         headers=proxy.headers(**{"Content-Encoding": "gzip", "Content-Type": "application/json"}))
    assert good.status_code == 201


# -- transfer codings ---------------------------------------------------------------------------------------------
def chunked_post(proxy: Proxy, path: str, coding: bytes, body: bytes) -> bytes:
    return exchange(proxy, b"POST " + path.encode() + b" HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer "
                    + proxy.key.encode() + b"\r\nContent-Type: application/json\r\nTransfer-Encoding: " + coding
                    + b"\r\n\r\n" + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")


@pytest.mark.parametrize("coding", [b"gzip, chunked", b"identity, chunked", b"deflate,chunked"])
def test_a_transfer_coding_other_than_chunked_is_501_in_the_routes_shape_and_nothing_is_stored(proxy: Proxy, coding):
    """aiohttp reads `gzip, chunked` as plain chunked: the route would take gzip bytes for the body (and a front
    proxy that decoded them would have seen another request). Refused, unread, on every kind of route."""
    before = proxy.rollouts_stored()
    for path, shape in (("/rollouts", b'"error":{"message"'), ("/v1/chat/completions", b'"error":{"message"'),
                        ("/v1/messages", b'"type":"error"')):
        body = b'{"task_id": "coded"}' if path == "/rollouts" else json.dumps(
            {"model": BASE_MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}).encode()
        answer = chunked_post(proxy, path, coding, body)
        assert answer.startswith(b"HTTP/1.1 501 "), answer[:300]
        assert b"unsupported_transfer_encoding" in answer or b"not implemented" in answer
        assert shape in answer and b"Connection: close" in answer, answer[-300:]
    assert proxy.rollouts_stored() == before
    # chunked alone, in any letter case (codings are case-insensitive), is read as ever
    assert chunked_post(proxy, "/rollouts", b"Chunked", b'{"task_id": "chunked"}').startswith(b"HTTP/1.1 201 ")


# -- connections held at once -------------------------------------------------------------------------------------
def test_connections_past_the_limit_are_answered_503_and_closed_and_the_proxy_serves_again_once_they_go(
        postgres_server: str, tmp_path):
    """Idle connections cost a file descriptor each: held past --max-connections, the next is told 503 (with
    Retry-After, in the OpenAI error shape) and closed, unread; once some go, requests are served as before."""
    with engine_in_thread(Stub(BASE_MODEL)) as engine_url, fresh_database(postgres_server) as database_url:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with running(proxy_command(port, [engine_url], database_url, "--max-connections", "8", "--spool-path",
                                   str(tmp_path / "spool.jsonl")), url + "/healthz", log_path=tmp_path / "proxy.log"):
            idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]
            time.sleep(0.5)  # all eight accepted
            with socket.create_connection(("127.0.0.1", port)) as extra:  # a request sent at once, as clients do
                extra.sendall(b"POST /rollouts HTTP/1.1\r\nHost: proxy\r\nContent-Length: 2\r\n\r\n{}")
                extra.settimeout(5)
                answer = b""
                while chunk := extra.recv(65536):
                    answer += chunk
            head, body = answer.split(b"\r\n\r\n", 1)
            assert head.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in head, head
            assert json.loads(body)["error"]["code"] == "too_many_connections"
            for sock in idle[:2]:
                sock.close()
            time.sleep(0.5)
            assert requests.post(f"{url}/rollouts", json={}, timeout=10).status_code == 201
            for sock in idle[2:]:
                sock.close()


# -- ids a rollout or a call names ------------------------------------------------------------------------------
@pytest.mark.parametrize("body, param", [
    ({"task_id": "t" * 257}, "task_id"),
    ({"task_id": "tab\there"}, "task_id"),
    ({"agent": "a" * 129}, "agent"),
    ({"agent": "has space"}, "agent"),
    ({"agent": ".."}, "agent"),
    ({"task_id": "task\n"}, "task_id"),
    ({"agent": "agent\n"}, "agent"),
], ids=["long-task", "control-task", "long-agent", "space-agent", "dot-agent", "newline-task", "newline-agent"])
def test_a_rollout_naming_an_id_the_store_cannot_hold_is_422_and_nothing_is_stored(proxy: Proxy, body, param):
    before = proxy.rollouts_stored()
    answer = requests.post(f"{proxy.url}/rollouts", json=body, headers=proxy.headers(), timeout=10)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["param"] == param
    assert proxy.rollouts_stored() == before


def test_a_final_reward_naming_a_task_id_too_long_is_422_and_the_rollout_stays_open(proxy: Proxy):
    rollout = requests.post(f"{proxy.url}/rollouts", json={}, headers=proxy.headers(), timeout=10).json()
    answer = requests.post(f"{proxy.url}/reward", headers=proxy.headers(), timeout=10,
                           json={"rollout_id": rollout["rollout_id"], "reward": 1.0, "task_id": "t" * 300})
    assert answer.status_code == 422 and answer.json()["error"]["param"] == "task_id"
    stored = requests.get(f"{proxy.url}/rollouts/{rollout['rollout_id']}", headers=proxy.headers(), timeout=10)
    assert stored.json()["reward"] is None


# -- forms beyond those: two keys, a large rollout, the web view's times and cursors, calls the store refuses ------
@pytest.mark.parametrize("second", ["Authorization: Bearer rlp_not-a-key", "x-api-key: OTHER"])
def test_a_request_with_two_different_keys_is_401_whichever_comes_first(proxy: Proxy, second: str):
    second = second.replace("OTHER", proxy.victim).encode()
    for first, then in ((b"Authorization: Bearer " + proxy.key.encode(), second),
                        (second, b"Authorization: Bearer " + proxy.key.encode())):
        answer = exchange(proxy, b"POST /rollouts HTTP/1.1\r\nHost: proxy\r\n" + first + b"\r\n" + then
                          + b"\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
        assert answer.startswith(b"HTTP/1.1 401") and b'"code":"several_api_keys"' in answer, answer[:300]
    same = requests.get(f"{proxy.url}/v1/models", timeout=10,
                        headers={"Authorization": f"Bearer {proxy.key}", "x-api-key": proxy.key})
    assert same.status_code == 200  # the one key twice, as some clients send it


@pytest.mark.parametrize("host", [b"evil.example/path?", b"user@evil.example", b"", b"proxy:99999", b"\xff\xfe"])
def test_a_host_that_is_not_a_host_is_400_and_no_rollout_is_made_for_it(proxy: Proxy, host: bytes):
    """The Host is written into the base_url a new rollout gets: a path or user part would change where it points."""
    before = proxy.rollouts_stored()
    answer = exchange(proxy, b"POST /rollouts HTTP/1.1\r\nHost: " + host + b"\r\nAuthorization: Bearer "
                      + proxy.key.encode() + b"\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
    assert answer.startswith(b"HTTP/1.1 400") and b'"code":"invalid_host"' in answer, answer[:300]
    assert proxy.rollouts_stored() == before
    made = requests.post(f"{proxy.url}/rollouts", json={}, headers=proxy.headers(), timeout=10).json()
    assert made["base_url"].startswith(f"http://127.0.0.1:{proxy.port}/rollouts/")


@pytest.mark.parametrize("name, first, second", [
    ("X-Rollout-Id", "one", "two"), ("X-Agent-Name", "one", "two"), ("X-Task-Id", "one", "two"),
    ("X-Rlproxy-Eval", "1", "0")])
def test_a_call_context_header_sent_twice_with_different_values_is_400(proxy: Proxy, name, first, second):
    body = json.dumps({"model": BASE_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    answer = exchange(proxy, f"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer "
                             f"{proxy.key}\r\n{name}: {first}\r\n{name}: {second}\r\nContent-Type: application/json"
                             f"\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}".encode())
    assert answer.startswith(b"HTTP/1.1 400") and b'"code":"repeated_header"' in answer, answer[:300]


def test_a_rollout_or_reward_body_past_its_bound_is_413_and_nothing_is_stored(proxy: Proxy):
    before = proxy.rollouts_stored()
    large = json.dumps({"metadata": {"notes": "x" * (1024 * 1024)}}).encode()  # --max-rollout-body-bytes: 1 MiB
    declared = requests.post(f"{proxy.url}/rollouts", data=large, headers=proxy.headers(), timeout=10)
    chunked = requests.post(f"{proxy.url}/rollouts", data=iter([large]), headers=proxy.headers(), timeout=10)
    reward = requests.post(f"{proxy.url}/reward", data=large, headers=proxy.headers(), timeout=10)
    for answer in (declared, chunked, reward):
        assert answer.status_code == 413 and answer.json()["error"]["code"] == "rollout_body_too_large"
    assert proxy.rollouts_stored() == before


def cursor(value, rollout_id: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([value, rollout_id]).encode()).decode()


@pytest.mark.parametrize("query", [
    "since=0001-01-01T00:00:00%2B14:00", "until=9999-12-31T23:59:59-14:00",  # no UTC time
    "sort=reward_high&cursor=" + cursor(10 ** 40, "a"),  # past what the driver takes
    "sort=reward_high&cursor=" + cursor(1.0, "a\u0000"),  # a NUL: no database takes it
    "sort=newest&cursor=" + cursor({"t": "0001-01-01T00:00:00+14:00"}, "a"),
], ids=["since", "until", "huge-reward", "nul-id", "time-without-utc"])
def test_the_web_views_odd_times_and_cursors_are_400(proxy: Proxy, query: str):
    answer = requests.get(f"{proxy.url}/ui/api/rollouts?{query}", headers=proxy.headers(), timeout=10)
    assert answer.status_code == 400, answer.text


def test_calls_the_store_refuses_fill_the_rejected_file_only_up_to_its_bound(proxy: Proxy):
    rejected = proxy.spool.with_suffix(".rejected.jsonl")
    refuse_marked_calls(proxy.database_url)
    for number in range(8):  # about 16 KiB each: twice the bound in all
        answer = requests.post(f"{proxy.url}/v1/chat/completions", headers=proxy.headers(), timeout=30, json={
            "model": BASE_MODEL, "max_tokens": 2,
            "messages": [{"role": "user", "content": f"{number} {REFUSED_MARK} " + "n" * 16 * 1024}]})
        assert answer.status_code == 200  # answered: only its record is refused
    deadline = time.monotonic() + 30
    while "(--rejected-max-bytes)" not in proxy.logged() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "(--rejected-max-bytes)" in proxy.logged()
    assert 0 < rejected.stat().st_size <= REJECTED_MAX
    assert all(json.loads(line)["call"]["id"] for line in rejected.read_text().splitlines())
