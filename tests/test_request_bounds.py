"""The work one request can cause is bounded before it is done: a compressed body inflates only so far, a refused
request's body is not read, `100 Continue` invites a body only once the key and the declared size pass — and
another tenant's calls stay fast while all of it is hit. Against `rlproxy serve` with keys on, in front of the
stand-in engine, which records every request it gets."""
from __future__ import annotations

import gzip
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import orjson
import psutil
import pytest
import requests

from testkit.stub_engine import BASE_MODEL, Stub
from tests.support import free_port, fresh_database, make_key, proxy_command, running
from tests.tenants import engine_in_thread

MAX_BODY = 64 * 1024 * 1024  # --client-max-size's default
MAX_INFLATED = 16 * 1024 * 1024  # --max-inflated-size's default


@dataclass
class Proxy:
    url: str
    port: int
    process: psutil.Process
    stub: Stub
    key: str  # an agent key of project alpha
    victim: str  # an agent key of project beta

    def chat_calls(self) -> int:
        return sum(1 for method, path in self.stub.received if path.endswith("/chat/completions"))

    def forwarded(self) -> int:
        """Requests the engine got on an agent's behalf: the proxy's own look at /v1/models (its replica probe,
        which runs on its own clock) is not one."""
        return sum(1 for method, path in self.stub.received if (method, path) != ("GET", "/v1/models"))

    def rss(self) -> int:
        return self.process.memory_info().rss

    def cpu_seconds(self) -> float:
        times = self.process.cpu_times()
        return times.user + times.system


@pytest.fixture(scope="module")
def proxy(postgres_server: str, tmp_path_factory) -> Iterator[Proxy]:
    workdir = tmp_path_factory.mktemp("bounds")
    stub = Stub(BASE_MODEL)
    with engine_in_thread(stub) as engine_url, fresh_database(postgres_server) as database_url:
        keys = [make_key(database_url, project) for project in ("alpha", "beta")]
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        args = proxy_command(port, [engine_url], database_url, "--auth", "on",
                             "--spool-path", str(workdir / "spool.jsonl"))
        with running(args, url + "/healthz", log_path=workdir / "proxy.log") as process:
            yield Proxy(url, port, psutil.Process(process.pid), stub, *keys)


def chat_body(content: str) -> bytes:
    return orjson.dumps({"model": BASE_MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4})


def headers(key: str, **more: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "Content-Type": "application/json", **more}


# -- compressed bodies ---------------------------------------------------------------------------------------------
def test_a_gzip_body_within_the_bounds_is_an_ordinary_call(proxy: Proxy):
    before = proxy.chat_calls()
    answer = requests.post(f"{proxy.url}/v1/chat/completions", data=gzip.compress(chat_body("hi " * 1000)),
                           headers=headers(proxy.key, **{"Content-Encoding": "gzip"}), timeout=30)
    assert answer.status_code == 200, answer.text
    assert proxy.chat_calls() == before + 1


def test_61_kb_of_gzip_is_not_a_60_mib_chat_call(proxy: Proxy):
    bomb = gzip.compress(chat_body("a" * (60 << 20)), 9)
    assert len(bomb) < 62_000
    before = proxy.chat_calls()
    answer = requests.post(f"{proxy.url}/v1/chat/completions", data=bomb,
                           headers=headers(proxy.key, **{"Content-Encoding": "gzip"}), timeout=30)
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "inflation_ratio_too_high"
    assert proxy.chat_calls() == before  # the engine saw nothing


def test_a_body_that_compresses_well_but_inflates_past_the_size_bound_is_413(proxy: Proxy):
    """Under the ratio (random hex compresses about 2:1), over --max-inflated-size."""
    body = gzip.compress(chat_body(random.Random(0).randbytes(MAX_INFLATED // 2).hex()), 1)
    answer = requests.post(f"{proxy.url}/v1/chat/completions", data=body,
                           headers=headers(proxy.key, **{"Content-Encoding": "gzip"}), timeout=30)
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "inflated_body_too_large"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/responses", "/tokenize",
                                  "/v1/traces", "/reward", "/rollouts"])
def test_a_bomb_is_413_on_every_route_that_reads_a_body(proxy: Proxy, path: str):
    before = proxy.forwarded()
    bomb = gzip.compress(chat_body("a" * (60 << 20)), 9)
    answer = requests.post(f"{proxy.url}{path}", data=bomb, timeout=30,
                           headers=headers(proxy.key, **{"Content-Encoding": "gzip"}))
    assert answer.status_code == 413
    assert proxy.forwarded() == before


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/responses", "/tokenize",
                                  "/reward", "/rollouts"])
def test_a_body_of_a_million_empty_arrays_is_413_before_it_is_parsed(proxy: Proxy, path: str):
    """3 MB of `[],` parse into a million Python lists (0.66 s of the event loop; 64 MiB of them, 10-20 s and
    2 GB): counted on the bytes first, refused at once, whatever the route would think of it afterwards."""
    before = proxy.forwarded()
    body = b'{"model": "%s", "messages": [' % BASE_MODEL.encode() + b"[]," * 1_000_000 + b"[]]}"
    began = time.monotonic()
    answer = requests.post(f"{proxy.url}{path}", data=body, headers=headers(proxy.key), timeout=30)
    assert answer.status_code == 413, answer.text
    if path not in ("/reward", "/rollouts"):  # those two refuse a body this size for its size, even sooner
        assert "more than 1000000 values" in answer.json()["error"]["message"]  # OpenAI's or Anthropic's shape
    assert time.monotonic() - began < 5
    assert proxy.forwarded() == before


def test_brackets_and_commas_inside_strings_are_not_counted_as_values(proxy: Proxy):
    """A prompt of pasted JSON holds a quarter of a million brackets and commas, all inside one string."""
    answer = requests.post(f"{proxy.url}/v1/chat/completions", data=chat_body('[{"a": 1}, ' * 50_000),
                           headers=headers(proxy.key), timeout=60)
    assert answer.status_code == 200, answer.text


def test_public_routes_take_no_body_and_are_not_worked_harder_by_floods(proxy: Proxy):
    """/healthz, /readyz, /openapi.json need no key. A gzip body sent to one was invited and inflated (16 MiB a
    connection); now refused unread. A flood of /readyz shares one look at the database and the engines a
    second (each look opened a connection and asked every engine); /openapi.json is built once."""
    bomb = gzip.compress(b"a" * (16 << 20), 9)
    answer = requests.get(f"{proxy.url}/healthz", data=bomb, timeout=30,
                          headers={"Content-Encoding": "gzip", "Expect": "100-continue"})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "body_not_allowed"

    def engine_probes() -> int:
        return sum(1 for method, path in proxy.stub.received if path == "/v1/models")

    before, began = engine_probes(), time.monotonic()
    answers = [requests.get(f"{proxy.url}/readyz", timeout=10).status_code for _ in range(30)]
    assert answers == [200] * 30
    assert engine_probes() - before <= 2 + 2 * (time.monotonic() - began)  # one look a second (and the watcher's)
    documents = [requests.get(f"{proxy.url}/openapi.json", timeout=10) for _ in range(3)]
    assert len({d.content for d in documents}) == 1 and documents[0].json()["openapi"].startswith("3.1")


@pytest.mark.parametrize("path", ["/reward", "/rollouts", "/rollouts/some-rollout/events"])
def test_a_chunked_body_past_a_small_routes_bound_is_refused_without_reading_it_all(proxy: Proxy, path: str):
    """Those routes take at most 1 MiB (an event 64 KiB); sent in chunks (no length to refuse it by), a body
    used to be read to the proxy's whole 64 MiB first. Now reading stops at the route's bound."""
    sent = 0

    def chunks():
        nonlocal sent
        for _ in range(16 << 10):  # 64 MiB in 4 KiB pieces, if it were all read
            sent += 4096
            yield b" " * 4096

    try:
        answer = requests.post(f"{proxy.url}{path}", data=chunks(), headers=headers(proxy.key), timeout=30)
        assert answer.status_code == 413
    except requests.ConnectionError:  # answered and closed while still sending: as good
        pass
    assert sent < 8 << 20


def test_a_bomb_sent_in_chunks_or_as_raw_deflate_is_413_too(proxy: Proxy):
    deflater = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)  # raw deflate, no zlib header
    bomb = deflater.compress(chat_body("a" * (60 << 20))) + deflater.flush()
    chunks = (bomb[i:i + 4096] for i in range(0, len(bomb), 4096))  # Transfer-Encoding: chunked, no length
    answer = requests.post(f"{proxy.url}/v1/chat/completions", data=chunks, timeout=30,
                           headers=headers(proxy.key, **{"Content-Encoding": "deflate"}))
    assert answer.status_code == 413


@pytest.mark.parametrize("encoding", ["br", "zstd", "gzip, gzip", "compress"])
def test_an_encoding_the_proxy_does_not_inflate_is_415(proxy: Proxy, encoding: str):
    answer = requests.post(f"{proxy.url}/v1/chat/completions", data=b"\0" * 100,
                           headers=headers(proxy.key, **{"Content-Encoding": encoding}), timeout=30)
    assert answer.status_code == 415
    assert answer.json()["error"]["code"] == "unsupported_content_encoding"


def test_eight_compression_bombs_at_once_cost_little_memory_and_cpu(proxy: Proxy):
    bomb = gzip.compress(chat_body("a" * (60 << 20)), 9)
    rss, cpu = proxy.rss(), proxy.cpu_seconds()
    statuses = []

    def send() -> None:
        statuses.append(requests.post(f"{proxy.url}/v1/chat/completions", data=bomb, timeout=30,
                                      headers=headers(proxy.key, **{"Content-Encoding": "gzip"})).status_code)

    threads = [threading.Thread(target=send) for _ in range(8)]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    took = time.monotonic() - began
    assert statuses == [413] * 8
    grew, spent = proxy.rss() - rss, proxy.cpu_seconds() - cpu
    print(f"8 bombs at once: {took:.2f} s, RSS +{grew / 2**20:.1f} MiB, {spent:.3f} CPU-s in the proxy")
    assert grew < 64 * 2**20 and spent < 2.0 and took < 5


# -- refused requests are not read -------------------------------------------------------------------------------
def upload(proxy: Proxy, head: bytes, size: int, *, wait_for_continue: bool = False) -> tuple[bytes, int, float]:
    """Send `head` and then up to `size` bytes of body on a raw socket, the way a client streams an upload;
    returns what the proxy answered, how much of the body it took and how long that took."""
    sock = socket.create_connection(("127.0.0.1", proxy.port))
    sock.settimeout(10)
    began = time.monotonic()
    sock.sendall(head + f"Content-Length: {size}\r\n\r\n".encode())
    if wait_for_continue:
        sock.settimeout(0.5)
        try:
            interim = sock.recv(4096)
        except TimeoutError:
            interim = b""
        sock.settimeout(10)
        if not interim.startswith(b"HTTP/1.1 100 Continue"):
            answer = interim + _read_all(sock)
            sock.close()
            return answer, 0, time.monotonic() - began
    sent, chunk = 0, b"x" * 65536
    try:
        while sent < size:
            sent += sock.send(chunk[:size - sent])
    except OSError:  # the proxy closed the connection: the rest of the body is not wanted
        pass
    answer = _read_all(sock)
    sock.close()
    return answer, sent, time.monotonic() - began


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except OSError:
        pass
    return data


def test_a_401_to_a_large_upload_closes_the_connection_without_reading_the_body(proxy: Proxy):
    size = MAX_BODY - 1
    answer, sent, took = upload(proxy, b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\n"
                                       b"Authorization: Bearer not-a-key\r\nContent-Type: application/json\r\n", size)
    assert answer.startswith(b"HTTP/1.1 401")
    assert b"Connection: close" in answer
    assert sent < size // 4 and took < 3, (sent, took)  # before: all 64 MiB read and thrown away


def test_a_413_for_a_declared_size_closes_the_connection_without_reading_the_body(proxy: Proxy):
    answer, sent, _ = upload(proxy, b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\n"
                                    b"Authorization: Bearer " + proxy.key.encode() + b"\r\n", MAX_BODY + 1)
    assert answer.startswith(b"HTTP/1.1 413") and b"Connection: close" in answer
    assert sent < MAX_BODY // 4


@pytest.mark.parametrize(("key", "size", "status"), [
    ("not-a-key", 100, b"401"),
    ("alpha", MAX_BODY + 1, b"413"),
])
def test_100_continue_is_not_sent_before_the_key_and_the_size_pass(proxy: Proxy, key: str, size: int,
                                                                     status: bytes):
    token = proxy.key if key == "alpha" else key
    answer, sent, _ = upload(proxy, b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nExpect: 100-continue\r\n"
                                    b"Authorization: Bearer " + token.encode() + b"\r\n", size, wait_for_continue=True)
    assert answer.startswith(b"HTTP/1.1 " + status) and b"100 Continue" not in answer
    assert sent == 0


def test_100_continue_is_sent_once_they_pass(proxy: Proxy):
    body = chat_body("hello")
    sock = socket.create_connection(("127.0.0.1", proxy.port))
    sock.settimeout(10)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nExpect: 100-continue\r\n"
                 b"Authorization: Bearer " + proxy.key.encode() + b"\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode())
    assert sock.recv(4096).startswith(b"HTTP/1.1 100 Continue")
    sock.sendall(body)
    assert _read_all(sock).startswith(b"HTTP/1.1 200")
    sock.close()


def test_an_expectation_other_than_100_continue_is_417(proxy: Proxy):
    answer = requests.post(f"{proxy.url}/v1/chat/completions", data=chat_body("hi"), timeout=30,
                           headers=headers(proxy.key, Expect="the-unexpected"))
    assert answer.status_code == 417
    assert answer.json()["error"]["code"] == "expectation_failed"


# -- another tenant while the bounds are hit ------------------------------------------------------------------------
ATTACKER = """
import gzip, socket, sys
port, kind, key = int(sys.argv[1]), sys.argv[2], sys.argv[3]
if kind == "bomb":  # 61 KB of gzip that inflates to a 60 MiB chat call
    body = gzip.compress(b'{"model": "m", "messages": [{"role": "user", "content": "' + b"a" * (60 << 20) + b'"}]}', 9)
    head = f"Authorization: Bearer {key}\\r\\nContent-Encoding: gzip\\r\\n"
else:  # 64 MiB with a wrong key
    body, head = b"x" * ((64 << 20) - 1), "Authorization: Bearer not-a-key\\r\\n"
head = (f"POST /v1/chat/completions HTTP/1.1\\r\\nHost: proxy\\r\\nConnection: close\\r\\n{head}"
        f"Content-Length: {len(body)}\\r\\n\\r\\n").encode()
request, first = head + body, True
while True:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        try:
            sock.sendall(request)
        except OSError:
            pass
        try:
            while sock.recv(65536):
                pass
        except OSError:
            pass
    if first:
        print("attacking", flush=True)
        first = False
"""


@contextmanager
def attackers(proxy: Proxy, kinds: list[str]) -> Iterator[None]:
    """Each kind of attack in a process of its own (the stand-in engine shares the test's), under way before the
    block starts."""
    running = [subprocess.Popen([sys.executable, "-c", ATTACKER, str(proxy.port), kind, proxy.key],
                                stdout=subprocess.PIPE, text=True) for kind in kinds]
    try:
        for process in running:
            assert process.stdout.readline().strip() == "attacking"
        yield
    finally:
        for process in running:
            process.kill()
            process.wait()


def test_another_tenants_calls_stay_fast_while_the_bounds_are_hit(proxy: Proxy):
    def victim_p50(n: int) -> float:
        latencies = []
        with requests.Session() as session:
            for _ in range(n):
                began = time.perf_counter()
                answer = session.post(f"{proxy.url}/v1/chat/completions", data=chat_body("hi"),
                                      headers=headers(proxy.victim), timeout=30)
                latencies.append(time.perf_counter() - began)
                assert answer.status_code == 200
        return statistics.median(latencies)

    quiet = victim_p50(20)
    with attackers(proxy, ["bomb", "bomb", "upload", "upload"]):
        attacked = victim_p50(30)
    print(f"victim p50: {quiet * 1000:.1f} ms quiet, {attacked * 1000:.1f} ms under 2 bomb and 2 upload attackers")
    assert attacked < max(10 * quiet, 0.05)  # before: 5.8 ms quiet, 2.1 s attacked
