"""OpenTelemetry trace exports, the proxy's `/v1/traces`: an export read into the facts the proxy scores
(export.py, counted on the wire before it is parsed: wire.py), decoded in worker processes off the event loop
(decoding.py) that each project has a share of (share.py), and the rewards its spans carry stored through
store/rewards.py (span_rewards.py).

This is the wing's one door: the rest of the proxy imports only what this module exports, never a module inside."""
from __future__ import annotations

from proxy.otlp.decoding import DECODERS, decoders_of
from proxy.otlp.export import JSON_TYPE, PROTOBUF_TYPES, SpanFacts, export_response, requested_tool_call_ids
from proxy.otlp.span_rewards import (
    IGNORED_NO_ROLLOUT,
    IGNORED_NOTHING_TO_SCORE,
    REJECTED,
    SpanResult,
    ToolWeights,
    has_rewards,
    store_span_rewards,
)

__all__ = ["DECODERS", "IGNORED_NOTHING_TO_SCORE", "IGNORED_NO_ROLLOUT", "JSON_TYPE", "PROTOBUF_TYPES", "REJECTED",
           "SpanFacts", "SpanResult", "ToolWeights", "decoders_of", "export_response", "has_rewards",
           "requested_tool_call_ids", "store_span_rewards"]
