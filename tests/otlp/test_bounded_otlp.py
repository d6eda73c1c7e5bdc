"""Bounded OTLP ingest: an export is counted before it is parsed and decoded in a worker process, so one
project's export, however it is packed, never holds up another project's calls (tests/bounded.py)."""
from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from google.protobuf.internal.encoder import _VarintBytes as varint
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.bounded import (
    MAX_REWARDS_PER_CALL,
    Proxy,
    add_calls,
    assert_victim_unharmed,
    bounded_proxy,
    error,
    under_attack,
)


@pytest.fixture(scope="module")
def proxy(stub_url, postgres_server, run_dir) -> Iterator[Proxy]:
    with bounded_proxy(stub_url, postgres_server, run_dir) as running:
        yield running


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


def test_commas_inside_an_attributes_text_are_not_counted_as_values(proxy: Proxy):
    """An agent's span may carry a prompt of CSV text: a million commas inside a string are one value, not a
    million (the count before parsing skips strings), while the same commas outside strings are still refused,
    and so is a string left open to hide them."""
    csv = "1," * 900_000 + ",\\\",\"" * 100_000  # CSV text with escaped quotes and backslashes among its commas
    span = {"traceId": "0" * 32, "spanId": "0" * 16, "name": "prompt",
            "attributes": [{"key": "gen_ai.prompt", "value": {"stringValue": csv}}]}
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()
    assert body.count(b",") > 960_000  # more than the default budget's values, all inside one string
    assert post_json_export(proxy, body).status_code == 200
    error(post_json_export(proxy, b'{"resourceSpans": "' + b"," * 1_000_000), 413, "too_many_fields")
    # the count is one pass however the strings are built: a megabyte of escaped quotes in a string never closed
    # (each a place a careless pattern would start again) is refused as the invalid JSON it is, at once
    began = time.monotonic()
    error(post_json_export(proxy, b'{"resourceSpans": "' + b'\\"' * 500_000), 400, "invalid_otlp")
    assert time.monotonic() - began < 10


def test_what_an_export_holds_is_counted_on_the_wire_before_it_is_parsed(proxy: Proxy):
    """Counts the parser never reaches: a million elements of one array attribute, a million copies of a span's
    name (the parser would keep only the last, but reading them is work all the same)."""
    values = b"\x0a\x00" * 1_000_000  # ArrayValue.values, each an empty AnyValue
    any_value = b"\x2a" + varint(len(values)) + values  # AnyValue.array_value
    attribute = b"\x0a\x01k\x12" + varint(len(any_value)) + any_value  # KeyValue key "k", value
    span = b"\x4a" + varint(len(attribute)) + attribute  # Span.attributes
    error(post_export(proxy, wrap_span(span)), 413, "too_many_attributes")
    error(post_export(proxy, wrap_span(b"\x2a\x00" * 1_000_000)), 413, "too_many_fields")  # Span.name


@pytest.mark.parametrize("prefix", [b"\x7b\x7c", b"\x0b\x0c"], ids=["unknown-group", "group-where-a-message-is"])
def test_a_group_in_front_of_a_million_spans_does_not_stop_the_count(proxy: Proxy, prefix: bytes):
    """protobuf's parser keeps an unknown group (an empty one is two bytes) and reads on past it: the walk stopped
    there and let the parser build every span after it. OTLP never uses groups: 400 at once."""
    began = time.monotonic()
    error(post_export(proxy, prefix + empty_spans_export(1_000_000)), 400, "invalid_otlp")
    assert time.monotonic() - began < 5


def test_a_truncated_export_is_refused_by_the_count(proxy: Proxy):
    error(post_export(proxy, empty_spans_export(10)[:-1]), 400, "invalid_otlp")
    error(post_export(proxy, b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"), 400, "invalid_otlp")


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
