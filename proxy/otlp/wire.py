"""How much an OTLP protobuf export holds, counted from the wire before it is parsed. Parsing builds every message
the body names: 2 MB can name a million empty spans (170 MB once parsed), 64 MB thirty times as many. This walk
reads only tags and lengths, descends into the messages the trace schema defines (known from the generated
descriptors, so field numbers are never restated here) and stops at the first count past the budget: refusing
an export costs at most its budget in steps, whatever the body holds.

What counts: ResourceSpans, ScopeSpans, Span, Span.Event and Span.Link as spans; every KeyValue (attributes of
resources, scopes, spans, events and links, and the entries of kvlist values) and every element of an array
value as an attribute; every field met, of any kind, as a step (a body of a million repeated scalar fields
costs the walk, not the parser, a million steps). A body the walk cannot follow (a group, which the trace schema
never uses; a truncated field; nesting past the parser's limit) is refused, not left to the parser: the parser
keeps an unknown group and reads on past it, so a two-byte group in front of a million spans would otherwise
skip the count and have all of them built."""
from __future__ import annotations

from google.protobuf.descriptor import Descriptor
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import ArrayValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from core.errors import RlproxyError

SPAN_LIKE = frozenset(d.full_name for d in (ResourceSpans.DESCRIPTOR, ScopeSpans.DESCRIPTOR, Span.DESCRIPTOR,
                                            Span.Event.DESCRIPTOR, Span.Link.DESCRIPTOR))
ATTRIBUTE = KeyValue.DESCRIPTOR.full_name
ARRAY = ArrayValue.DESCRIPTOR.full_name
VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5
MAX_DEPTH = 100  # protobuf's own parser refuses deeper nesting


class Exceeded(RlproxyError):
    """The export holds more than the budget of `what` ("spans", "attributes" or "fields")."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class Malformed(RlproxyError):
    """The body is not an export the walk can follow: refused with what was wrong."""


def count_export(body: bytes, max_spans: int, max_attributes: int, max_fields: int) -> None:
    """Raise `Exceeded` as soon as the export in `body` is seen to hold more than the budget, `Malformed` where
    the walk cannot follow it. Depth first, so what it holds in memory is one entry per level of nesting."""
    spans = attributes = fields = 0
    descriptor, position, end = ExportTraceServiceRequest.DESCRIPTOR, 0, len(body)
    outer: list[tuple[Descriptor, int, int]] = []  # the messages the walk is inside of, where to go on in each
    while True:
        if position >= end:
            if position > end:
                raise Malformed(f"a field of {descriptor.name} runs past the end of its message")
            if not outer:
                return
            descriptor, position, end = outer.pop()
            continue
        key, position = _varint(body, position)
        fields += 1
        if fields > max_fields:
            raise Exceeded("fields")
        wire_type = key & 7
        if wire_type == VARINT:
            _, position = _varint(body, position)
        elif wire_type == FIXED64:
            position += 8
        elif wire_type == FIXED32:
            position += 4
        elif wire_type == LENGTH_DELIMITED:
            length, position = _varint(body, position)
            field = descriptor.fields_by_number.get(key >> 3)
            if field is None or field.message_type is None:
                position += length  # a string, bytes, packed scalars or an unknown field: checked at the loop's top
                continue
            kind = field.message_type.full_name
            if kind in SPAN_LIKE:
                spans += 1
                if spans > max_spans:
                    raise Exceeded("spans")
            elif kind == ATTRIBUTE or descriptor.full_name == ARRAY:
                attributes += 1
                if attributes > max_attributes:
                    raise Exceeded("attributes")
            if position + length > end:
                raise Malformed(f"field {key >> 3} of {descriptor.name} runs past the end of its message")
            if len(outer) >= MAX_DEPTH:
                raise Malformed(f"messages nested deeper than {MAX_DEPTH}")
            outer.append((descriptor, position + length, end))
            descriptor, end = field.message_type, position + length
        else:  # 3 and 4 (groups): not in the trace schema; 6 and 7: no such wire type
            raise Malformed(f"wire type {wire_type} (field {key >> 3} of {descriptor.name}) is not used by OTLP")


def _varint(data: bytes, position: int) -> tuple[int, int]:
    result = shift = 0
    while position < len(data) and shift < 64:
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, position
        shift += 7
    raise Malformed("a varint is truncated or longer than 10 bytes")
