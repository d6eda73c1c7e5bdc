"""OpenTelemetry span ingest: `POST /v1/traces`, an OTLP/HTTP trace receiver. Agents already instrumented with
OpenTelemetry point an OTLP exporter here and their spans become rewards with no reward code: a failed tool
execution is the `tool_error` AIR of the call that asked for the tool, and `rlproxy.reward` a final or a
per-call reward (docs/contract.md says which attributes mean what). Spans that name no rollout, or carry
nothing to score, are taken and ignored, so an agent may export all its spans here.

Bodies are binary protobuf or OTLP JSON; `Content-Encoding: gzip` is undone by the proxy as it reads, within
its bounds (proxy/edge/uploads.py). The answer is an ExportTraceServiceResponse in the request's encoding, whose
partial_success counts the refused spans (another project's or an unknown rollout, an expired one, a conflicting final reward, a reward for no call,
one for a call that holds the most rewards kept) and says why. Keys and projects apply as on `POST /reward`.

Bounded before the work: the body is decoded in a worker process (proxy/otlp/decoding.py), which refuses an
export past `--otlp-max-spans` or `--otlp-max-attributes` with 413 before reading it span by span; an export
with more reward-carrying spans than `--max-rewards-per-export` is 413 before anything of it is stored. Each
project has a share of the decoders (proxy/otlp/share.py): an export past it is 429 before its body is read."""
from __future__ import annotations

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError
from google.protobuf import json_format

from proxy.edge import reward_giver
from proxy.bodies import TraceExportResult
from proxy.api import Answer, Endpoint
from proxy.errors import InvalidRequest, UnsupportedMediaType
from proxy.otlp import DECODERS, JSON_TYPE, PROTOBUF_TYPES, REJECTED, export_response
from proxy.schemas import TraceExport
from proxy.state import state

MESSAGES_SHOWN = 10  # refused spans explained in error_message; the rest are counted


async def export_traces(request: web.Request) -> web.Response:
    content_type = request.content_type
    if content_type not in (*PROTOBUF_TYPES, JSON_TYPE):
        raise UnsupportedMediaType(f"/v1/traces reads OTLP as application/x-protobuf or application/json, "
                                   f"not {content_type!r}")
    decoders, project = request.app[DECODERS], request.get("project")
    # The project's share of the decoders is taken before the body is read: past it, 429 costs no reading.
    with decoders.admit(project, _known_size(request), content_type) as share:
        try:
            raw = await request.read()
        except RequestPayloadError as exc:  # e.g. a Content-Encoding: gzip body that is not gzip
            raise InvalidRequest(f"the request body could not be read: {exc}", code="invalid_body") from None
        share.resize(len(raw))
        spans = await decoders.span_facts(raw, content_type, project)  # in a worker process, within budget

    # a rollout token never reaches here (proxy/edge/token_scope.py): who gives the spans' rewards is the key's kind
    results = await state(request).ingest.spans(spans, project=project, giver=reward_giver(request, ""))
    refused = [result.error or "refused" for result in results if result.outcome == REJECTED]
    message = "; ".join(refused[:MESSAGES_SHOWN])
    if len(refused) > MESSAGES_SHOWN:
        message += f"; and {len(refused) - MESSAGES_SHOWN} more"
    response = export_response(len(refused), message)
    if content_type in PROTOBUF_TYPES:  # OTLP answers in the request's encoding
        return web.Response(body=response.SerializeToString(), content_type=content_type)
    return TraceExportResult.model_validate(json_format.MessageToDict(response)).reply()


def _known_size(request: web.Request) -> int | None:
    """The bytes the decoders will be given, where known before reading: a compressed body the edge has already
    inflated (proxy/edge/uploads.py leaves it where `read()` finds it), else the declared length (None when chunked)."""
    inflated = request._read_bytes  # noqa: SLF001 - aiohttp's own place for a body already read
    return len(inflated) if inflated is not None else request.content_length


ENDPOINTS = [
    Endpoint("post", "/v1/traces", export_traces,
             "OTLP/HTTP trace export: spans of a rollout become rewards (failed tool spans, rlproxy.reward)",
             {200: Answer("Taken; partialSuccess counts and explains the refused spans.", TraceExportResult)},
             (400, 413, 415, 429, 503), body=TraceExport, protobuf=True),
]
