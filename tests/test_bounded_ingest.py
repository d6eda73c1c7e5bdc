"""Bounded ingest: what agents report (OTLP span exports, rewards, rollout events) and what they read back
(`GET /rollouts/{id}`) cannot make the proxy do unbounded work, and what is refused is refused before the work,
off the event loop. Each bound is hit by project alpha while project beta, another tenant of the same proxy,
keeps making small chat calls: beta's median latency stays low. A real `rlproxy serve` (keys on) in front of
the stand-in engine, real Postgres."""
from __future__ import annotations

import asyncio
import os
import signal
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from google.protobuf.internal.encoder import _VarintBytes as varint
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from store.calls import write_calls
from store.db import create_engine, session_factory
from store.records import CallRecord, ChoiceRecord
from store.models import utcnow
from tests.support import free_port, fresh_database, make_key, proxy_command, running

ADMIN_KEY = "bounded-ingest-admin-" + uuid.uuid4().hex
MAX_EVENTS = 8
MAX_REWARDS_PER_CALL = 3
VICTIM_P50_MS = 200


@dataclass
class Proxy:
    url: str
    alpha: str  # the tenant hitting the bounds
    beta: str  # the tenant that must not notice
    database_url: str
    pid: int

    def headers(self, key: str, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}", **extra}

    def rollout(self, key: str | None = None) -> str:
        created = requests.post(f"{self.url}/rollouts", json={}, headers=self.headers(key or self.alpha), timeout=30)
        assert created.status_code == 201, created.text
        return created.json()["rollout_id"]

    def chat(self, key: str, rollout_id: str | None = None) -> requests.Response:
        base = f"{self.url}/rollouts/{rollout_id}" if rollout_id else self.url
        return requests.post(f"{base}/v1/chat/completions", headers=self.headers(key), timeout=60,
                             json={"model": "stub-model", "messages": [{"role": "user", "content": "hi"}]})

    def read(self, rollout_id: str, **query: int) -> requests.Response:
        return requests.get(f"{self.url}/rollouts/{rollout_id}", params=query, headers=self.headers(self.alpha),
                            timeout=120)


@pytest.fixture(scope="module")
def proxy(stub_url, postgres_server, run_dir) -> Iterator[Proxy]:
    with fresh_database(postgres_server) as database_url:
        alpha, beta = make_key(database_url, "alpha"), make_key(database_url, "beta")
        port = free_port()
        args = proxy_command(port, [stub_url], database_url, "--spool-path", str(run_dir / "bounded-spool.jsonl"),
                             "--admin-key", ADMIN_KEY, "--max-rollout-events", str(MAX_EVENTS),
                             "--max-rewards-per-call", str(MAX_REWARDS_PER_CALL))
        url = f"http://127.0.0.1:{port}"
        with running(args, url + "/healthz", log_path=run_dir / "proxy-bounded.log") as process:
            yield Proxy(url, alpha, beta, database_url, process.pid)


@contextmanager
def victim(proxy: Proxy) -> Iterator[list[float]]:
    """Beta's chat calls, one after another, for as long as the block runs; yields their latencies (ms)."""
    latencies: list[float] = []
    done = threading.Event()

    def measure() -> None:
        while not done.is_set():
            started = time.perf_counter()
            assert proxy.chat(proxy.beta).status_code == 200
            latencies.append((time.perf_counter() - started) * 1000)

    thread = threading.Thread(target=measure, name="victim")
    thread.start()
    try:
        yield latencies
    finally:
        done.set()
        thread.join(120)


def under_attack(proxy: Proxy, attack: Callable[[], requests.Response], seconds: float = 4.0,
                 attackers: int = 2) -> tuple[list[int], list[float]]:
    """`attack` sent over and over by `attackers` threads for `seconds` while beta calls; (statuses, beta's
    latencies)."""
    statuses: list[int] = []
    deadline = time.monotonic() + seconds

    def attacker() -> None:
        while time.monotonic() < deadline:
            statuses.append(attack().status_code)

    with victim(proxy) as latencies:
        threads = [threading.Thread(target=attacker, name=f"attacker-{n}") for n in range(attackers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
    assert statuses and latencies
    return statuses, latencies


def assert_victim_unharmed(latencies: list[float]) -> None:
    print(f"beta: {len(latencies)} calls, p50 {statistics.median(latencies):.1f} ms, max {max(latencies):.0f} ms")
    assert statistics.median(latencies) < VICTIM_P50_MS, f"beta's p50 {statistics.median(latencies):.0f} ms"


def error(response: requests.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()["error"]
    assert body["code"] == code, body
    return body["message"]


# --- OTLP ----------------------------------------------------------------------------------------------------


def empty_spans_export(count: int) -> bytes:
    """An export holding `count` empty spans, as the wire has them (2 bytes each): built directly, since building
    a million through the protobuf API would itself take the test seconds."""
    scope = b"\x12\x00" * count  # ScopeSpans.spans (field 2), each an empty Span
    resource = b"\x12" + varint(len(scope)) + scope  # ResourceSpans.scope_spans (field 2)
    return b"\x0a" + varint(len(resource)) + resource  # ExportTraceServiceRequest.resource_spans (field 1)


def wrap_span(span: bytes) -> bytes:
    """An export of one span, given as its wire bytes."""
    scope = b"\x12" + varint(len(span)) + span
    resource = b"\x12" + varint(len(scope)) + scope
    return b"\x0a" + varint(len(resource)) + resource


def reward_spans_export(rollout_id: str, count: int, call_id: str | None = None) -> bytes:
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    for number in range(count):
        span = scope.spans.add(trace_id=uuid.uuid4().bytes, span_id=number.to_bytes(8, "big"),
                               parent_span_id=b"\x01" * 8, name="step")
        span.attributes.add(key="rlproxy.rollout_id").value.string_value = rollout_id
        span.attributes.add(key="rlproxy.reward").value.double_value = 0.25
        if call_id is not None:
            span.attributes.add(key="rlproxy.call_id").value.string_value = call_id
    return request.SerializeToString()


def post_export(proxy: Proxy, body: bytes) -> requests.Response:
    return requests.post(f"{proxy.url}/v1/traces", data=body, timeout=120,
                         headers=proxy.headers(proxy.alpha, **{"Content-Type": "application/x-protobuf"}))


def test_an_export_of_a_million_empty_spans_is_refused_while_other_tenants_are_served(proxy: Proxy):
    """2 MB of protobuf holding a million empty spans used to hold the event loop for 21 s."""
    body = empty_spans_export(1_000_000)
    assert len(body) < 2_100_000
    message = error(post_export(proxy, body), 413, "too_many_spans")
    assert "10000 spans" in message and "--otlp-max-spans" in message
    statuses, latencies = under_attack(proxy, lambda: post_export(proxy, body))
    assert set(statuses) == {413}
    assert_victim_unharmed(latencies)


def json_spans_export(count: int) -> bytes:
    spans = b"[" + b",".join([b"{}"] * count) + b"]"
    return b'{"resourceSpans": [{"scopeSpans": [{"spans": ' + spans + b"}]}]}"


def post_json_export(proxy: Proxy, body: bytes) -> requests.Response:
    return requests.post(f"{proxy.url}/v1/traces", data=body, timeout=120,
                         headers=proxy.headers(proxy.alpha, **{"Content-Type": "application/json"}))


def test_an_otlp_json_export_is_bounded_before_it_is_parsed_and_counted_before_it_is_mapped(proxy: Proxy):
    """A million values cannot be within the budget: refused from the body's commas and brackets, unparsed.
    Twenty thousand empty spans can be parsed cheaply, and are counted before protobuf's JSON mapping reads them."""
    error(post_json_export(proxy, json_spans_export(1_000_000)), 413, "too_many_fields")
    error(post_json_export(proxy, json_spans_export(20_000)), 413, "too_many_spans")


def test_what_an_export_holds_is_counted_on_the_wire_before_it_is_parsed(proxy: Proxy):
    """Counts the parser never reaches: a million elements of one array attribute, a million copies of a span's
    name (the parser would keep only the last, but reading them is work all the same)."""
    values = b"\x0a\x00" * 1_000_000  # ArrayValue.values, each an empty AnyValue
    any_value = b"\x2a" + varint(len(values)) + values  # AnyValue.array_value
    attribute = b"\x0a\x01k\x12" + varint(len(any_value)) + any_value  # KeyValue key "k", value
    span = b"\x4a" + varint(len(attribute)) + attribute  # Span.attributes
    error(post_export(proxy, wrap_span(span)), 413, "too_many_attributes")
    error(post_export(proxy, wrap_span(b"\x2a\x00" * 1_000_000)), 413, "too_many_fields")  # Span.name


def test_span_events_count_as_spans(proxy: Proxy):
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add(name="chatty")
    for _ in range(10_000):
        span.events.add(name="log")
    error(post_export(proxy, request.SerializeToString()), 413, "too_many_spans")


def decoding_workers(pid: int) -> list[int]:
    """The proxy's OTLP decoding processes (multiprocessing's spawned workers, not its resource tracker)."""
    children = [int(child) for task in Path(f"/proc/{pid}/task").iterdir()
                for child in (task / "children").read_text().split()]
    return [child for child in children if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes()]


def test_a_decoding_worker_that_dies_costs_one_export_a_503_and_the_next_gets_a_new_one(proxy: Proxy):
    assert post_export(proxy, empty_spans_export(1)).status_code == 200
    [worker] = decoding_workers(proxy.pid)
    os.kill(worker, signal.SIGKILL)
    error(post_export(proxy, empty_spans_export(1)), 503, "decoder_unavailable")
    assert post_export(proxy, empty_spans_export(1)).status_code == 200
    assert decoding_workers(proxy.pid) not in ([], [worker])


def test_an_export_with_too_many_attributes_is_refused(proxy: Proxy):
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add(name="wide")
    for number in range(200_001):
        span.attributes.add(key=f"k{number}")
    message = error(post_export(proxy, request.SerializeToString()), 413, "too_many_attributes")
    assert "200000 attributes" in message


def test_an_export_within_the_budget_is_still_read(proxy: Proxy):
    response = post_export(proxy, empty_spans_export(10_000 - 2))  # its resource and scope blocks count too
    assert response.status_code == 200, response.text
    assert not ExportTraceServiceResponse.FromString(response.content).HasField("partial_success")


def test_an_export_carrying_more_rewards_than_one_export_may_is_refused_and_stores_nothing(proxy: Proxy):
    """One 0.8 MB export used to store 5,000 reward rows."""
    rollout_id = proxy.rollout()
    call_id = proxy.chat(proxy.alpha, rollout_id).headers["X-Rlproxy-Call-Id"]
    body = reward_spans_export(rollout_id, 5_000, call_id)
    message = error(post_export(proxy, body), 413, "too_many_rewards")
    assert "5000 spans" in message and "--max-rewards-per-export" in message
    statuses, latencies = under_attack(proxy, lambda: post_export(proxy, body))
    assert set(statuses) == {413}
    assert_victim_unharmed(latencies)
    assert proxy.read(rollout_id).json()["rewards"] == []


def test_a_call_keeps_at_most_its_budget_of_rewards_from_spans(proxy: Proxy):
    rollout_id = proxy.rollout()
    call_id = proxy.chat(proxy.alpha, rollout_id).headers["X-Rlproxy-Call-Id"]
    response = post_export(proxy, reward_spans_export(rollout_id, MAX_REWARDS_PER_CALL + 2, call_id))
    assert response.status_code == 200, response.text
    partial = ExportTraceServiceResponse.FromString(response.content).partial_success
    assert partial.rejected_spans == 2 and "--max-rewards-per-call" in partial.error_message
    rewards = proxy.read(rollout_id).json()["rewards"]
    assert [r["call_id"] for r in rewards] == [call_id] * MAX_REWARDS_PER_CALL


# --- rewards -------------------------------------------------------------------------------------------------


def test_a_call_keeps_at_most_its_budget_of_posted_rewards_and_the_earlier_ones(proxy: Proxy):
    rollout_id = proxy.rollout()
    call_id = proxy.chat(proxy.alpha, rollout_id).headers["X-Rlproxy-Call-Id"]

    def reward(value: float) -> requests.Response:
        return requests.post(f"{proxy.url}/reward", json={"rollout_id": rollout_id, "call_id": call_id,
                                                          "reward": value}, headers=proxy.headers(proxy.alpha))

    for number in range(MAX_REWARDS_PER_CALL):
        assert reward(number).status_code == 200
    assert "--max-rewards-per-call" in error(reward(9), 413, "too_many_rewards")
    statuses, latencies = under_attack(proxy, lambda: reward(9), seconds=2)
    assert set(statuses) == {413}
    assert_victim_unharmed(latencies)
    rewards = proxy.read(rollout_id).json()["rewards"]
    assert [r["value"] for r in rewards] == list(range(MAX_REWARDS_PER_CALL))


# --- rollout events ------------------------------------------------------------------------------------------


def post_event(proxy: Proxy, rollout_id: str, data, event_type: str = "span") -> requests.Response:
    return requests.post(f"{proxy.url}/rollouts/{rollout_id}/events", json={"event_type": event_type, "data": data},
                         headers=proxy.headers(proxy.alpha), timeout=60)


def test_events_past_the_rollouts_budget_are_refused_and_the_earlier_ones_kept(proxy: Proxy):
    rollout_id = proxy.rollout()
    for number in range(MAX_EVENTS):
        assert post_event(proxy, rollout_id, {"n": number}).json() == {
            "rollout_id": rollout_id, "event_type": "span", "reward": None, "stored": True}
    message = error(post_event(proxy, rollout_id, {"n": MAX_EVENTS}), 413, "too_many_events")
    assert f"holds {MAX_EVENTS} events" in message and "--max-rollout-events" in message
    statuses, latencies = under_attack(proxy, lambda: post_event(proxy, rollout_id, {"n": -1}), seconds=2)
    assert set(statuses) == {413}
    assert_victim_unharmed(latencies)
    # A reward event is the final reward, not an event: still taken.
    assert post_event(proxy, rollout_id, {"value": 1.0}, "reward").json()["reward"] == 1.0
    kept = proxy.read(rollout_id).json()["metadata"]["events"]
    assert [event["data"] for event in kept] == [{"n": number} for number in range(MAX_EVENTS)]


def test_an_event_larger_than_the_budget_is_refused_before_it_is_read(proxy: Proxy):
    """1 MiB events used to be kept, each rewriting the rollout's whole metadata."""
    rollout_id = proxy.rollout()
    big = {"blob": "x" * (1 << 20)}
    message = error(post_event(proxy, rollout_id, big), 413, "event_too_large")
    assert "65536" in message and "--max-event-bytes" in message
    statuses, latencies = under_attack(proxy, lambda: post_event(proxy, rollout_id, big))
    assert set(statuses) == {413}
    assert_victim_unharmed(latencies)
    assert post_event(proxy, rollout_id, {"blob": "x" * 60_000}).status_code == 200
    assert [e["data"]["blob"][:1] for e in proxy.read(rollout_id).json()["metadata"]["events"]] == ["x"]


# --- reading a rollout back ----------------------------------------------------------------------------------


def add_calls(database_url: str, rollout_id: str, count: int, response_bytes: int,
              tool_calls: dict[int, str] | None = None) -> list[str]:
    """`count` recorded calls of the rollout, written as the proxy's writer writes them (a rollout of thousands
    of calls through the proxy would take the test minutes); `tool_calls`: the tool call id a call's answer
    asked for, by the call's index."""
    def message(number: int) -> dict:
        if tool_calls and number in tool_calls:
            return {"role": "assistant", "tool_calls": [{"id": tool_calls[number], "type": "function",
                                                         "function": {"name": "calculate", "arguments": "{}"}}]}
        return {"role": "assistant", "content": "y" * response_bytes}

    records = [CallRecord(id=uuid.uuid4().hex, route="chat", started_at=utcnow(), rollout_id=rollout_id,
                          agent="a", project="alpha", prompt_token_ids=[1, 2, 3],
                          response={"choices": [{"index": 0, "message": message(number)}]},
                          choices=[ChoiceRecord(0, [4, 5], [-0.5, -0.25], "stop")]) for number in range(count)]

    async def write() -> None:
        engine = create_engine(database_url)
        try:
            async with session_factory(engine)() as session, session.begin():
                await write_calls(session, records)
        finally:
            await engine.dispose()

    asyncio.run(write())
    return [record.id for record in records]


def test_a_large_rollout_reads_back_in_pages_with_every_call_once(proxy: Proxy):
    rollout_id = proxy.rollout()
    written = add_calls(proxy.database_url, rollout_id, 2_300, 20_000)

    first = proxy.read(rollout_id)  # no parameters: the first 1,000 calls and where to go on
    assert first.status_code == 200, first.text
    pages, page = [first.json()], first.json()
    assert len(page["calls"]) == 1_000 and page["next"] == page["calls"][-1]["seq"]
    while page["next"] is not None:
        page = proxy.read(rollout_id, after=page["next"], limit=700).json()
        pages.append(page)
    assert [len(p["calls"]) for p in pages] == [1_000, 700, 600]
    assert [c["call_id"] for p in pages for c in p["calls"]] == written

    statuses, latencies = under_attack(proxy, lambda: proxy.read(rollout_id), seconds=6, attackers=1)
    assert set(statuses) == {200}
    assert_victim_unharmed(latencies)


def test_a_small_rollout_reads_back_whole_as_before(proxy: Proxy):
    rollout_id = proxy.rollout()
    call_ids = [proxy.chat(proxy.alpha, rollout_id).headers["X-Rlproxy-Call-Id"] for _ in range(3)]
    whole = proxy.read(rollout_id).json()
    assert [c["call_id"] for c in whole["calls"]] == call_ids and whole["next"] is None
    assert [c["call_id"] for c in proxy.read(rollout_id, limit=2).json()["calls"]] == call_ids[:2]


@pytest.mark.parametrize("query, param", [({"limit": 0}, "limit"), ({"limit": 1001}, "limit"),
                                          ({"limit": "ten"}, "limit"), ({"after": -1}, "after")])
def test_a_page_outside_the_bounds_is_a_422_naming_the_parameter(proxy: Proxy, query, param):
    response = requests.get(f"{proxy.url}/rollouts/{proxy.rollout()}", params=query,
                            headers=proxy.headers(proxy.alpha), timeout=30)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == param


def test_a_tool_span_finds_the_call_that_asked_for_it_in_a_long_rollout(proxy: Proxy):
    """The rollout's responses are read newest first, a batch at a time, until the tool call is found: the
    third of 300 calls is still found."""
    rollout_id = proxy.rollout()
    call_ids = add_calls(proxy.database_url, rollout_id, 300, 1_000, tool_calls={2: "call_early"})
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add(
        trace_id=uuid.uuid4().bytes, span_id=b"\x07" * 8, parent_span_id=b"\x01" * 8, name="execute_tool calculate")
    for key, value in (("rlproxy.rollout_id", rollout_id), ("gen_ai.operation.name", "execute_tool"),
                       ("gen_ai.tool.call.id", "call_early")):
        span.attributes.add(key=key).value.string_value = value
    span.status.code = 2  # ERROR
    response = post_export(proxy, request.SerializeToString())
    assert response.status_code == 200, response.text
    [air] = [r for r in proxy.read(rollout_id).json()["rewards"] if r["kind"] == "air"]
    assert (air["call_id"], air["reason"]) == (call_ids[2], "tool_error")
