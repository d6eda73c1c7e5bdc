"""`rlproxy serve`: how much work one request may make the proxy do where it ingests what agents report (OTLP
span exports, rewards, rollout events) and where it reads a rollout back. Each bound is checked before the work
it bounds, and a request past one is refused with 413 (docs/security.md, Bounded ingest); an OTLP export past its
project's share of the decoders with 429, which exporters retry."""
from __future__ import annotations

from pydantic import Field

from core.settings.base import Part


class IngestSettings(Part):
    otlp_max_spans: int = Field(
        10_000, gt=0, description="Most spans one OTLP export may hold, their events and links counted as spans "
                                  "(the OpenTelemetry SDK exports 512 at a time); past it the export is 413.",
        json_schema_extra={"flag": "otlp-max-spans"})
    otlp_max_attributes: int = Field(
        200_000, gt=0, description="Most attributes one OTLP export may hold (of its resources, scopes, spans, "
                                   "span events and links together; elements of array values and entries of "
                                   "kvlist values count too); past it the export is 413.",
        json_schema_extra={"flag": "otlp-max-attributes"})
    otlp_decoders: int = Field(
        1, gt=0, description="Worker processes that decode OTLP exports (started by the first), so that "
                             "decoding never holds up other requests; exports beyond them wait their turn.",
        json_schema_extra={"flag": "otlp-decoders"})
    otlp_project_bytes: int = Field(
        8 * 1024 * 1024, gt=0, description="Most bytes of OTLP exports one project (the operator's key is one of "
                                           "its own) may have waiting for or in the decoders at once; an export "
                                           "past it is 429 with Retry-After before its body is read (exporters "
                                           "retry). A project with none in flight is always let in. About 3 s of "
                                           "decoding at worst, so one project cannot keep the others' exports "
                                           "waiting past an exporter's 10 s timeout; the decoders take projects "
                                           "in turn as well.",
        json_schema_extra={"flag": "otlp-project-bytes"})
    max_rewards_per_export: int = Field(
        1_000, gt=0, description="Most spans carrying a reward one OTLP export may hold; past it the export is "
                                 "413 and nothing of it is stored.",
        json_schema_extra={"flag": "max-rewards-per-export"})
    max_rewards_per_call: int = Field(
        64, gt=0, description="Most per-call rewards (POST /reward with call_id, rlproxy.reward spans) one "
                              "recorded call may hold; a reward past it is refused (413, or a refused span).",
        json_schema_extra={"flag": "max-rewards-per-call"})
    max_rollout_events: int = Field(
        256, gt=0, description="Most events (POST /rollouts/{id}/events, reward events aside) one rollout keeps; "
                               "an event past it is 413 and the earlier ones stay.",
        json_schema_extra={"flag": "max-rollout-events"})
    max_rollout_body_bytes: int = Field(
        1024 * 1024, gt=0, description="Largest body of POST /rollouts and POST /reward (their metadata is kept "
                                       "with the rollout), in bytes; a larger one is 413.",
        json_schema_extra={"flag": "max-rollout-body-bytes"})
    max_event_bytes: int = Field(
        64 * 1024, gt=0, description="Largest body of one rollout event, in bytes; a larger one is 413.",
        json_schema_extra={"flag": "max-event-bytes"})
