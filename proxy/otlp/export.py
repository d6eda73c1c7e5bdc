"""OTLP trace export requests read into what the proxy scores: which rollout a span belongs to, whether it is a
tool execution that failed, and the reward it carries. Pure: no I/O, no database (proxy/otlp/span_rewards.py stores
what this finds, proxy/routes/traces.py is the HTTP edge).

The wire formats are OpenTelemetry's own (`opentelemetry-proto`): binary protobuf, or OTLP's JSON encoding,
which is protobuf's JSON mapping except that trace and span ids are hex strings instead of base64.

Attributes read (span attributes win over resource attributes for the rollout id):

    rlproxy.rollout_id       the rollout the span belongs to; spans without one are ignored
    rlproxy.reward           a number: a reward
    rlproxy.reward.final     true: the rollout's final reward; false: a reward for one call
    rlproxy.call_id          the recorded call a per-call reward is for (X-Rlproxy-Call-Id)
    gen_ai.operation.name    "execute_tool" marks a tool execution (OpenTelemetry GenAI conventions) ...
    gen_ai.tool.call.id      ... and the tool call id the model gave it, which names the call that asked for it
"""
from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from core.checks import reward_problem
from core.chat_view import chat_view
from core.errors import RlproxyError
from core.ids import is_valid_id
from proxy.otlp.wire import Exceeded, Malformed, count_export
from proxy.strict_json import MAX_JSON_DEPTH, json_values_bound, too_deep

PROTOBUF_TYPES = ("application/x-protobuf", "application/protobuf")
JSON_TYPE = "application/json"

ROLLOUT_ID = "rlproxy.rollout_id"
REWARD = "rlproxy.reward"
REWARD_FINAL = "rlproxy.reward.final"
CALL_ID = "rlproxy.call_id"
OPERATION = "gen_ai.operation.name"
EXECUTE_TOOL = "execute_tool"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"

_ID_FIELDS = ("traceId", "spanId", "parentSpanId")  # hex in OTLP JSON, bytes (base64) in protobuf's mapping


class OtlpFormatError(RlproxyError, ValueError):
    """The body is not an OTLP trace export request in the encoding its content type names."""

    def __init__(self, message: str, code: str = "invalid_otlp") -> None:
        super().__init__(message)
        self.code = code  # the error code the route answers with


class OtlpTooLarge(OtlpFormatError):
    """The export holds more spans or attributes than the proxy takes in one export (a 413)."""


@dataclass(frozen=True, slots=True)
class ExportBudget:
    """How much one export may hold. Spans count with their events and links (each is a message the proxy would
    read), attributes wherever they are: on resources, scopes, spans, span events and links."""

    max_spans: int
    max_attributes: int

    @property
    def max_fields(self) -> int:
        """Fields of any kind (JSON: values) an export within the budget needs at most: a span's own fields
        and an attribute's key, value and the value's kind are far fewer than these per span and attribute."""
        return 16 * self.max_spans + 4 * self.max_attributes

    def refuse(self, what: str) -> OtlpTooLarge:
        if what == "spans":
            return OtlpTooLarge(f"the export holds more than {self.max_spans} spans, span events and links "
                                f"(--otlp-max-spans); send it in smaller batches", code="too_many_spans")
        if what == "attributes":
            return OtlpTooLarge(f"the export holds more than {self.max_attributes} attributes "
                                f"(--otlp-max-attributes); send it in smaller batches", code="too_many_attributes")
        return OtlpTooLarge(f"the export holds more than {self.max_fields} fields, more than "
                            f"{self.max_spans} spans with {self.max_attributes} attributes need "
                            f"(--otlp-max-spans, --otlp-max-attributes)", code="too_many_fields")

    def spans_exceeded(self, spans: int) -> None:
        if spans > self.max_spans:
            raise self.refuse("spans")

    def attributes_exceeded(self, attributes: int) -> None:
        if attributes > self.max_attributes:
            raise self.refuse("attributes")


@dataclass(frozen=True, slots=True)
class SpanFacts:
    """What one span says about a rollout."""

    trace_id: str  # hex
    span_id: str  # hex
    name: str
    start: datetime | None  # None when the exporter sent no start time
    rollout_id: str | None
    is_root: bool
    is_tool: bool
    tool_failed: bool  # a tool span with status ERROR
    tool_name: str | None
    tool_call_id: str | None
    call_id: str | None  # rlproxy.call_id
    reward: float | None
    reward_error: str | None  # why `rlproxy.reward` (or its final flag) cannot be used
    final_flag: bool | None  # rlproxy.reward.final as sent (None: absent)

    @property
    def key(self) -> dict[str, str]:
        """What identifies the span in a reward's metadata (so a replayed export is recognised)."""
        return {"source": "otlp", "trace_id": self.trace_id, "span_id": self.span_id}

    @property
    def is_final(self) -> bool:
        """A reward closes the rollout when the span says so, or, saying nothing, when it is the trace's root and
        names no call or tool call (the root span of an agent's run is the run)."""
        if self.final_flag is not None:
            return self.final_flag
        return self.is_root and not self.is_tool and self.call_id is None and self.tool_call_id is None


def decode_request(body: bytes, content_type: str, budget: ExportBudget) -> ExportTraceServiceRequest:
    """The export request in `body`; OtlpFormatError when it is not one, OtlpTooLarge when it holds more than
    `budget`, decided before the body is parsed: protobuf is counted on the wire (proxy/otlp/wire.py); JSON's
    values are bounded by its commas and brackets, then its spans and attributes counted on the parsed document
    before protobuf's JSON mapping reads it."""
    message = ExportTraceServiceRequest()
    if content_type in PROTOBUF_TYPES:
        try:
            count_export(body, budget.max_spans, budget.max_attributes, budget.max_fields)
        except Exceeded as exc:
            raise budget.refuse(exc.what) from None
        except Malformed as exc:
            raise OtlpFormatError(f"body is not a protobuf ExportTraceServiceRequest: {exc}") from None
        try:
            message.ParseFromString(body)
        except DecodeError as exc:
            raise OtlpFormatError(f"body is not a protobuf ExportTraceServiceRequest: {exc}") from None
        return message
    if json_values_bound(body) > budget.max_fields:
        raise budget.refuse("fields")
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise OtlpFormatError(f"body is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise OtlpFormatError("body must be a JSON object (an OTLP ExportTraceServiceRequest)")
    if too_deep(document, body):
        raise OtlpFormatError(f"body nests arrays and objects more than {MAX_JSON_DEPTH} levels deep",
                              code="json_too_deep")
    _count_document(document, budget)
    try:
        json_format.ParseDict(_ids_as_base64(document), message, ignore_unknown_fields=True)
    except (json_format.ParseError, TypeError, ValueError) as exc:
        raise OtlpFormatError(f"body is not an OTLP ExportTraceServiceRequest: {exc}") from None
    return message


def _count_document(document: dict[str, Any], budget: ExportBudget) -> None:
    """Raise OtlpTooLarge as soon as the parsed JSON export is seen to hold more than `budget` (what is not a
    list counts as empty: the protobuf mapping refuses it afterwards)."""
    spans, attributes = _length(document.get("resourceSpans")), 0
    budget.spans_exceeded(spans)
    for resource_spans in _objects(document.get("resourceSpans")):
        spans += _length(resource_spans.get("scopeSpans"))
        budget.spans_exceeded(spans)
        scopes = _objects(resource_spans.get("scopeSpans"))
        attributes += _length(_object(resource_spans.get("resource")).get("attributes"))
        for scope_spans in scopes:
            spans += _length(scope_spans.get("spans"))
            attributes += _length(_object(scope_spans.get("scope")).get("attributes"))
        budget.spans_exceeded(spans)
        budget.attributes_exceeded(attributes)
    for resource_spans in _objects(document.get("resourceSpans")):
        for scope_spans in _objects(resource_spans.get("scopeSpans")):
            for span in _objects(scope_spans.get("spans")):
                events, links = _objects(span.get("events")), _objects(span.get("links"))
                spans += len(events) + len(links)
                attributes += _length(span.get("attributes")) + sum(_length(item.get("attributes"))
                                                                    for item in events + links)
            budget.spans_exceeded(spans)
            budget.attributes_exceeded(attributes)


def _length(value: Any) -> int:
    return len(value) if isinstance(value, list) else 0


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def export_response(rejected: int, error_message: str) -> ExportTraceServiceResponse:
    """The export's answer; partial_success only when spans were refused (OTLP: unset means all accepted)."""
    response = ExportTraceServiceResponse()
    if rejected:
        response.partial_success.rejected_spans = rejected
        response.partial_success.error_message = error_message
    return response


def span_facts(request: ExportTraceServiceRequest) -> list[SpanFacts]:
    facts = []
    for resource_spans in request.resource_spans:
        resource_rollout = _attributes(resource_spans.resource.attributes).get(ROLLOUT_ID)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                facts.append(_facts(span, resource_rollout))
    return facts


def _facts(span: Span, resource_rollout: AnyValue | None) -> SpanFacts:
    attributes = _attributes(span.attributes)
    named = attributes.get(ROLLOUT_ID) or resource_rollout
    rollout_id = _text(named)
    reward, reward_error = _reward(attributes)
    if rollout_id is not None and not is_valid_id(rollout_id):
        rollout_id = None  # not an id the proxy could have handed out; such spans are counted as unlinked
    # A span that carries a reward and names its rollout or call in a form that cannot be one (a number, an id
    # no proxy hands out), or has no trace or span id to keep it once, is refused, not taken and dropped: the
    # exporter is told in `partial_success` that its reward went nowhere.
    carries = REWARD in attributes or REWARD_FINAL in attributes
    if carries and named is not None and rollout_id is None:
        reward_error = reward_error or f"{ROLLOUT_ID} must be a rollout id as a string"
    if carries and CALL_ID in attributes and _text(attributes.get(CALL_ID)) is None:
        reward_error = reward_error or f"{CALL_ID} must be a call id as a string"
    if carries and (len(span.trace_id) != 16 or len(span.span_id) != 8):
        reward_error = reward_error or "a span carrying a reward needs its 16-byte trace id and 8-byte span id"
    is_tool = _text(attributes.get(OPERATION)) == EXECUTE_TOOL
    final_flag, flag = None, attributes.get(REWARD_FINAL)
    if flag is not None:
        if flag.WhichOneof("value") == "bool_value":
            final_flag = flag.bool_value
        else:
            reward_error = reward_error or f"{REWARD_FINAL} must be a boolean"
    return SpanFacts(
        trace_id=span.trace_id.hex(), span_id=span.span_id.hex(), name=_clean(span.name) or "",
        start=(datetime.fromtimestamp(span.start_time_unix_nano / 1e9, timezone.utc)
               if span.start_time_unix_nano else None),
        rollout_id=rollout_id, is_root=not span.parent_span_id, is_tool=is_tool,
        tool_failed=is_tool and span.status.code == Status.STATUS_CODE_ERROR,
        tool_name=_clean(_text(attributes.get(TOOL_NAME))), tool_call_id=_clean(_text(attributes.get(TOOL_CALL_ID))),
        call_id=_text(attributes.get(CALL_ID)), reward=reward, reward_error=reward_error, final_flag=final_flag,
    )


def _reward(attributes: Mapping[str, AnyValue]) -> tuple[float | None, str | None]:
    value = attributes.get(REWARD)
    if value is None:
        return None, None
    kind = value.WhichOneof("value")
    if kind not in ("double_value", "int_value"):
        return None, f"{REWARD} must be a number, not {kind or 'empty'}"
    number = float(getattr(value, kind))
    if problem := reward_problem(number):
        return None, f"{REWARD}: {problem}"
    return number, None


def requested_tool_call_ids(route: str, response: dict[str, Any] | None) -> set[str]:
    """The ids of the tool calls a recorded call's response asked for, whatever API it came through: chat
    `tool_calls[].id`, Responses `function_call.call_id`, Messages `tool_use.id` (all read in chat form)."""
    _, chat_response = chat_view(route, None, response)
    ids = set()
    choices = chat_response.get("choices") if isinstance(chat_response, dict) else None
    for choice in choices if isinstance(choices, list) else ():
        message = choice.get("message") if isinstance(choice, dict) else None
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        for call in calls if isinstance(calls, list) else ():
            if isinstance(call, dict) and isinstance(call.get("id"), str) and call["id"]:
                ids.add(call["id"])
    return ids


def _attributes(pairs: Iterable[KeyValue]) -> dict[str, AnyValue]:
    return {pair.key: pair.value for pair in pairs}


def _text(value: AnyValue | None) -> str | None:
    if value is None or value.WhichOneof("value") != "string_value":
        return None
    return value.string_value or None


def _clean(text: str | None) -> str | None:
    """Text safe to store (Postgres takes no NUL), kept short: it only labels a reward."""
    return None if text is None else text.replace("\x00", "")[:256]


def _ids_as_base64(document: dict[str, Any]) -> dict[str, Any]:
    """OTLP JSON's hex trace and span ids rewritten as protobuf's JSON mapping has bytes (base64), in place."""
    for resource_spans in _objects(document.get("resourceSpans")):
        for scope_spans in _objects(resource_spans.get("scopeSpans")):
            for span in _objects(scope_spans.get("spans")):
                _hex_fields_as_base64(span)
                for link in _objects(span.get("links")):
                    _hex_fields_as_base64(link)
    return document


def _hex_fields_as_base64(item: dict[str, Any]) -> None:
    for name in _ID_FIELDS:
        value = item.get(name)
        if not isinstance(value, str):
            continue  # json_format names what is wrong with anything else
        try:
            item[name] = base64.b64encode(bytes.fromhex(value)).decode()
        except ValueError:
            raise OtlpFormatError(f"{name} {value[:64]!r} is not a hex string (OTLP JSON encodes ids in hex)") from None


def _objects(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


__all__ = ["JSON_TYPE", "PROTOBUF_TYPES", "ExportBudget", "OtlpFormatError", "OtlpTooLarge", "SpanFacts",
           "decode_request",
           "export_response", "requested_tool_call_ids", "span_facts"]
