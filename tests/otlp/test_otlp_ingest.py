"""OpenTelemetry spans as rewards: an agent instrumented with the OpenTelemetry SDK exports its spans to the
proxy's `POST /v1/traces` with the stock OTLP/HTTP exporter, and a failed tool span or an `rlproxy.reward`
attribute becomes a reward of the rollout, with no reward code. A real `rlproxy serve` (keys of two projects)
in front of the stub engine, real Postgres, the real openai SDK for the agent's calls."""
from __future__ import annotations

import asyncio
import gzip
from dataclasses import dataclass
from datetime import timedelta

import openai
import orjson
import pytest
import requests
from opentelemetry import baggage, context
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode
from sqlalchemy import update

from proxy.otlp import requested_tool_call_ids
from store.db import open_database, session_factory
from store.models import Rollout, RolloutStatus, utcnow
from tests.support import fresh_database, make_key, running_proxy

ADMIN_KEY = "otlp-test-admin-key"
TOOLS = [{"type": "function", "function": {"name": "calculate", "parameters": {"type": "object"}}}]


class RolloutIdFromBaggage(SpanProcessor):
    """What an agent adds: every span started while `rlproxy.rollout_id` is in the baggage carries it."""

    def on_start(self, span, parent_context=None) -> None:
        rollout_id = baggage.get_baggage("rlproxy.rollout_id", parent_context)
        if rollout_id:
            span.set_attribute("rlproxy.rollout_id", rollout_id)


@dataclass
class Proxy:
    url: str
    alpha: str  # a key of project alpha
    beta: str  # a key of project beta
    database_url: str

    def get(self, path: str, key: str | None = None) -> requests.Response:
        return requests.get(self.url + path, headers=auth(key or self.alpha), timeout=30)

    def rollout(self, rollout_id: str) -> dict:
        response = self.get(f"/rollouts/{rollout_id}")
        assert response.status_code == 200, response.text
        return response.json()

    def spans_counted(self, outcome: str) -> float:
        metrics = self.get("/metrics", ADMIN_KEY).text
        line = f'rlproxy_otlp_spans_total{{outcome="{outcome}"}} '
        return next((float(row[len(line):]) for row in metrics.splitlines() if row.startswith(line)), 0.0)


@dataclass
class Episode:
    rollout_id: str
    call_ids: list[str]  # the recorded calls, in order
    tool_call_id: str  # the tool call the first call's answer asked for


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def proxy(stub_url, postgres_server, run_dir) -> Proxy:
    with fresh_database(postgres_server) as database_url:
        alpha, beta = make_key(database_url, "alpha"), make_key(database_url, "beta")
        with running_proxy([stub_url], database_url, run_dir, "proxy-otlp",
                           env={"RLPROXY_ADMIN_KEY": ADMIN_KEY}) as url:
            yield Proxy(url, alpha, beta, database_url)


def run_agent(proxy: Proxy) -> Episode:
    """Two turns through the rollout's base_url: the model asks for a tool, the agent answers with its result."""
    created = requests.post(f"{proxy.url}/rollouts", json={"task_id": "calc"}, headers=auth(proxy.alpha)).json()
    client = openai.OpenAI(base_url=created["base_url"], api_key=proxy.alpha)
    messages = [{"role": "user", "content": "use tool to compute 6*7"}]
    first = client.chat.completions.with_raw_response.create(model="stub-model", messages=messages, tools=TOOLS)
    tool_call = first.parse().choices[0].message.tool_calls[0]
    messages += [first.parse().choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": tool_call.id, "content": "42"}]
    second = client.chat.completions.with_raw_response.create(model="stub-model", messages=messages, tools=TOOLS)
    return Episode(created["rollout_id"], [first.headers["X-Rlproxy-Call-Id"], second.headers["X-Rlproxy-Call-Id"]],
                   tool_call.id)


class Agent:
    """The agent's tracing: the OpenTelemetry SDK with the stock OTLP/HTTP exporter pointed at the proxy. Each
    span is exported as it ends, and also kept, so a test can send the same spans again."""

    def __init__(self, proxy: Proxy, key: str, compression: Compression | None = None) -> None:
        self.kept = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(RolloutIdFromBaggage())
        self.provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(
            endpoint=f"{proxy.url}/v1/traces", headers=auth(key), compression=compression)))
        self.provider.add_span_processor(SimpleSpanProcessor(self.kept))
        self.tracer = self.provider.get_tracer("agent")

    def in_rollout(self, rollout_id: str):
        """The one line an agent adds around an episode (here as a context manager)."""
        return _Attached(baggage.set_baggage("rlproxy.rollout_id", rollout_id))

    def tool_span(self, tool_call_id: str, failed: bool, **attributes):
        span = self.tracer.start_span("execute_tool calculate", attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "calculate",
            "gen_ai.tool.call.id": tool_call_id, **attributes})
        if failed:
            span.set_status(Status(StatusCode.ERROR, "division by zero"))
        span.end()

    def spans(self):
        return self.kept.get_finished_spans()


class _Attached:
    def __init__(self, ctx) -> None:
        self.ctx = ctx

    def __enter__(self):
        self.token = context.attach(self.ctx)

    def __exit__(self, *exc) -> None:
        context.detach(self.token)


def post_spans(proxy: Proxy, spans, key: str) -> ExportTraceServiceResponse:
    """Spans as the SDK's exporter encodes them, posted by hand to read the export's answer."""
    response = requests.post(f"{proxy.url}/v1/traces", data=encode_spans(spans).SerializeToString(),
                             headers={**auth(key), "Content-Type": "application/x-protobuf"}, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"] == "application/x-protobuf"
    return ExportTraceServiceResponse.FromString(response.content)


def air_rewards(rollout: dict) -> list[dict]:
    return [r for r in rollout["rewards"] if r["kind"] == "air"]


def test_a_failed_tool_span_penalises_the_call_that_asked_for_the_tool_once(proxy: Proxy):
    episode = run_agent(proxy)
    agent = Agent(proxy, proxy.alpha)
    with agent.in_rollout(episode.rollout_id):
        agent.tool_span(episode.tool_call_id, failed=True)

    [air] = air_rewards(proxy.rollout(episode.rollout_id))
    # the first call asked for the tool, though the second is the latest: the tool call id decides
    assert air["call_id"] == episode.call_ids[0]
    assert air["reason"] == "tool_error" and air["value"] == -0.25  # the proxy's AIR weight (--air-tool-error)
    assert air["metadata"]["tool_call_id"] == episode.tool_call_id and air["metadata"]["source"] == "otlp"

    duplicates = proxy.spans_counted("duplicate")
    assert not post_spans(proxy, agent.spans(), proxy.alpha).HasField("partial_success")  # the same span again
    assert len(air_rewards(proxy.rollout(episode.rollout_id))) == 1
    assert proxy.spans_counted("duplicate") == duplicates + 1


def test_a_tool_span_without_a_known_tool_call_id_goes_to_the_latest_call_before_it(proxy: Proxy):
    episode = run_agent(proxy)
    agent = Agent(proxy, proxy.alpha)
    with agent.in_rollout(episode.rollout_id):
        agent.tool_span("call-the-model-never-made", failed=True)
        agent.tool_span(episode.tool_call_id, failed=False)  # tool_success weighs 0 by default: nothing

    [air] = air_rewards(proxy.rollout(episode.rollout_id))
    assert air["call_id"] == episode.call_ids[1] and air["reason"] == "tool_error"


def test_a_reward_on_the_root_span_is_the_final_reward(proxy: Proxy):
    episode = run_agent(proxy)
    agent = Agent(proxy, proxy.alpha)
    with agent.in_rollout(episode.rollout_id):
        with agent.tracer.start_as_current_span("invoke_agent calc") as run:
            agent.tool_span(episode.tool_call_id, failed=False)
            run.set_attribute("rlproxy.reward", 1.0)

    rollout = proxy.rollout(episode.rollout_id)
    assert rollout["status"] == "finished" and rollout["reward"] == 1.0
    [final] = [r for r in rollout["rewards"] if r["kind"] == "final"]
    assert final["metadata"]["source"] == "otlp"

    # The same final reward again changes nothing; a different one is refused, as POST /reward answers 409.
    assert not post_spans(proxy, agent.spans(), proxy.alpha).HasField("partial_success")
    with agent.in_rollout(episode.rollout_id):
        with agent.tracer.start_as_current_span("invoke_agent calc", attributes={"rlproxy.reward": 0.0}):
            pass
    answer = post_spans(proxy, agent.spans()[-1:], proxy.alpha)
    assert answer.partial_success.rejected_spans == 1
    assert "already has final reward 1.0" in answer.partial_success.error_message
    assert proxy.rollout(episode.rollout_id)["reward"] == 1.0


def test_a_reward_for_one_call_is_stored_once(proxy: Proxy):
    episode = run_agent(proxy)
    agent = Agent(proxy, proxy.alpha)
    with agent.in_rollout(episode.rollout_id):
        with agent.tracer.start_as_current_span("invoke_agent calc"):
            with agent.tracer.start_as_current_span("judge", attributes={
                    "rlproxy.reward": 0.5, "rlproxy.call_id": episode.call_ids[1]}):
                pass
            # a reward on a (child) tool span is for the call that asked for the tool
            agent.tool_span(episode.tool_call_id, failed=False, **{"rlproxy.reward": 0.25})
    post_spans(proxy, agent.spans(), proxy.alpha)  # replayed

    rollout = proxy.rollout(episode.rollout_id)
    assert rollout["status"] == "open"  # the root span carried no reward
    per_call = sorted((r["call_id"], r["value"]) for r in rollout["rewards"] if r["kind"] == "call")
    assert per_call == sorted([(episode.call_ids[1], 0.5), (episode.call_ids[0], 0.25)])


def test_spans_of_another_projects_rollout_are_refused_without_a_trace(proxy: Proxy):
    episode = run_agent(proxy)  # project alpha's
    intruder = Agent(proxy, proxy.beta)
    with intruder.in_rollout(episode.rollout_id):
        intruder.tool_span(episode.tool_call_id, failed=True, **{"rlproxy.reward": -1.0, "rlproxy.reward.final": True})
    answer = post_spans(proxy, intruder.spans(), proxy.beta)
    assert answer.partial_success.rejected_spans == 1
    assert "does not exist" in answer.partial_success.error_message  # as for a rollout that does not exist

    rollout = proxy.rollout(episode.rollout_id)
    assert rollout["status"] == "open" and rollout["rewards"] == []


def test_an_expired_rollout_takes_no_rewards_from_spans(proxy: Proxy):
    episode = run_agent(proxy)
    expire(proxy.database_url, episode.rollout_id)  # as the trainer does past its reward TTL
    agent = Agent(proxy, proxy.alpha)
    with agent.in_rollout(episode.rollout_id):
        with agent.tracer.start_as_current_span("invoke_agent calc", attributes={"rlproxy.reward": 1.0}):
            agent.tool_span(episode.tool_call_id, failed=True)
    answer = post_spans(proxy, agent.spans(), proxy.alpha)
    assert answer.partial_success.rejected_spans == 2
    assert "expired" in answer.partial_success.error_message
    assert proxy.rollout(episode.rollout_id)["rewards"] == []


def expire(database_url: str, rollout_id: str) -> None:
    async def go() -> None:
        database = open_database(database_url)
        try:
            async with session_factory(database)() as session, session.begin():
                await session.execute(update(Rollout).where(Rollout.id == rollout_id)
                                      .values(status=RolloutStatus.EXPIRED, finished_at=utcnow()))
        finally:
            await database.dispose()

    asyncio.run(go())


def mark(database_url: str, rollout_id: str, **values) -> None:
    """Set columns of a rollout as the trainer does when a step takes it (lease) or has trained it."""
    async def go() -> None:
        database = open_database(database_url)
        try:
            async with session_factory(database)() as session, session.begin():
                await session.execute(update(Rollout).where(Rollout.id == rollout_id).values(**values))
        finally:
            await database.dispose()

    asyncio.run(go())


@pytest.mark.parametrize("taken", ["trained", "being-trained"])
def test_a_reward_for_a_call_of_a_rollout_a_step_took_is_refused_not_stored_unused(proxy: Proxy, taken: str):
    """The step read the calls' rewards when it took the rollout: one stored later was acknowledged and never
    used. Refused with 409 on /reward and as a rejected span; the final reward again is still a no-op."""
    episode = run_agent(proxy)
    before = requests.post(f"{proxy.url}/reward", headers=auth(proxy.alpha), json={
        "rollout_id": episode.rollout_id, "call_id": episode.call_ids[0], "reward": 0.5})
    assert before.status_code == 200, before.text
    final = {"rollout_id": episode.rollout_id, "reward": 1.0}
    assert requests.post(f"{proxy.url}/reward", headers=auth(proxy.alpha), json=final).status_code == 200
    mark(proxy.database_url, episode.rollout_id,
         **({"trained_at": utcnow()} if taken == "trained"
            else {"lease_owner": "trainer", "lease_expires_at": utcnow() + timedelta(minutes=5)}))

    late = requests.post(f"{proxy.url}/reward", headers=auth(proxy.alpha), json={
        "rollout_id": episode.rollout_id, "call_id": episode.call_ids[1], "reward": 0.5})
    assert late.status_code == 409, late.text
    assert "be used" in late.json()["error"]["message"]
    assert requests.post(f"{proxy.url}/reward", headers=auth(proxy.alpha), json=final).status_code == 200

    agent = Agent(proxy, proxy.alpha)
    with agent.in_rollout(episode.rollout_id):
        agent.tool_span(episode.tool_call_id, failed=True)  # an automatic (AIR) reward for the first call
    answer = post_spans(proxy, agent.spans(), proxy.alpha)
    assert answer.partial_success.rejected_spans == 1
    assert "trained" in answer.partial_success.error_message
    rewards = proxy.rollout(episode.rollout_id)["rewards"]
    assert sorted(r["kind"] for r in rewards) == ["call", "final"]  # what came in time, nothing after


def test_spans_that_name_no_rollout_are_taken_and_ignored(proxy: Proxy):
    ignored = proxy.spans_counted("ignored_no_rollout")
    agent = Agent(proxy, proxy.alpha)
    with agent.tracer.start_as_current_span("http GET", attributes={"rlproxy.reward": 1.0}):
        pass
    assert not post_spans(proxy, agent.spans(), proxy.alpha).HasField("partial_success")
    assert proxy.spans_counted("ignored_no_rollout") == ignored + 2


@pytest.mark.parametrize("attributes, words", [
    ({"rlproxy.rollout_id": 12345}, "rlproxy.rollout_id must be a rollout id"),
    ({"rlproxy.rollout_id": "not a rollout id!"}, "rlproxy.rollout_id must be a rollout id"),
    ({"rlproxy.call_id": 7}, "rlproxy.call_id must be a call id"),
], ids=["number-for-rollout", "malformed-rollout", "number-for-call"])
def test_a_reward_whose_rollout_or_call_cannot_be_named_is_refused_not_dropped(proxy: Proxy, attributes, words):
    """The exporter is told its reward went nowhere (before: taken as a span of no rollout, or given to the
    rollout's latest call, and counted as success)."""
    episode = run_agent(proxy)
    agent = Agent(proxy, proxy.alpha)
    named = {"rlproxy.rollout_id": episode.rollout_id, "rlproxy.reward": 0.5, **attributes}  # no baggage: as given
    with agent.tracer.start_as_current_span("judge", attributes=named):
        pass
    answer = post_spans(proxy, agent.spans(), proxy.alpha)
    assert answer.partial_success.rejected_spans >= 1 and words in answer.partial_success.error_message
    assert [r for r in proxy.rollout(episode.rollout_id)["rewards"] if r["kind"] == "call"] == []


def test_gzip_compressed_exports_are_read(proxy: Proxy):
    episode = run_agent(proxy)
    agent = Agent(proxy, proxy.alpha, compression=Compression.Gzip)
    with agent.in_rollout(episode.rollout_id):
        agent.tool_span(episode.tool_call_id, failed=True)
    assert [r["reason"] for r in air_rewards(proxy.rollout(episode.rollout_id))] == ["tool_error"]


def test_otlp_json_is_read_and_answered_in_json(proxy: Proxy):
    """OTLP's JSON encoding, as a collector or a non-Python SDK sends it: ids in hex, the rollout id here on
    the resource (one process per rollout)."""
    episode = run_agent(proxy)
    export = {"resourceSpans": [{
        "resource": {"attributes": [{"key": "rlproxy.rollout_id", "value": {"stringValue": episode.rollout_id}}]},
        "scopeSpans": [{"scope": {"name": "agent"}, "spans": [{
            "traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174", "name": "invoke_agent",
            "kind": 1, "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000001000000000",
            "attributes": [{"key": "rlproxy.reward", "value": {"doubleValue": 0.75}}]}]}]}]}
    body = gzip.compress(orjson.dumps(export))
    response = requests.post(f"{proxy.url}/v1/traces", data=body, timeout=30, headers={
        **auth(proxy.alpha), "Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert response.status_code == 200 and response.json() == {}
    assert proxy.rollout(episode.rollout_id)["reward"] == 0.75

    export["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"][0]["value"] = {"doubleValue": 0.5}
    response = requests.post(f"{proxy.url}/v1/traces", json=export, headers=auth(proxy.alpha), timeout=30)
    assert response.status_code == 200
    assert response.json()["partialSuccess"]["rejectedSpans"] == "1"


@pytest.mark.parametrize(("content_type", "body", "status", "words"), [
    ("application/x-protobuf", b"\xff\xff not protobuf", 400, "not a protobuf ExportTraceServiceRequest"),
    ("application/json", b"{not json", 400, "not valid JSON"),
    ("application/json", b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}', 400,
     "not a hex string"),
    ("application/json", b'{"resourceSpans": "all of them"}', 400, "not an OTLP ExportTraceServiceRequest"),
    ("text/plain", b"spans", 415, "application/x-protobuf or application/json"),
])
def test_what_is_not_an_otlp_export_is_refused_with_a_reason(proxy: Proxy, content_type, body, status, words):
    response = requests.post(f"{proxy.url}/v1/traces", data=body, timeout=30,
                             headers={**auth(proxy.alpha), "Content-Type": content_type})
    assert response.status_code == status
    assert words in response.json()["error"]["message"]


def test_a_body_that_is_not_the_gzip_it_claims_is_a_400(proxy: Proxy):
    response = requests.post(f"{proxy.url}/v1/traces", data=b"\x1f\x8b\x08 not gzip", timeout=30, headers={
        **auth(proxy.alpha), "Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"})
    assert response.status_code == 400


def test_tool_call_ids_are_read_from_every_wire_format():
    chat = {"choices": [{"message": {"tool_calls": [{"id": "call_1", "type": "function",
                                                     "function": {"name": "f", "arguments": "{}"}}]}}]}
    responses = {"output": [{"type": "function_call", "call_id": "call_2", "name": "f", "arguments": "{}"}]}
    messages = {"content": [{"type": "tool_use", "id": "toolu_3", "name": "f", "input": {}}]}
    assert requested_tool_call_ids("chat", chat) == {"call_1"}
    assert requested_tool_call_ids("responses", responses) == {"call_2"}
    assert requested_tool_call_ids("messages", messages) == {"toolu_3"}
