"""The spool's lines are an on-disk format: a proxy upgraded while calls wait in its spool reads the lines its
previous version wrote (store/records.py `CallRecord`, written and read by proxy/recording/lines.py). A field
renamed or removed in CallRecord makes such lines unreadable: they would be set aside instead of stored.

fixtures/spool-line-347f067.jsonl is one call as the release at commit 347f067 wrote it (before a call recorded
`sampling_override`). A change that fails this test needs a reader for the old lines, not a new fixture."""
from __future__ import annotations

from dataclasses import fields
from datetime import datetime, timezone
from pathlib import Path

import orjson

from proxy.recording.lines import Unreadable, encode, parse_line
from store.records import CallRecord, ChoiceRecord

PREVIOUS_RELEASE = Path(__file__).parent / "fixtures" / "spool-line-347f067.jsonl"


def test_a_line_the_previous_release_wrote_reads_as_the_same_call():
    line = PREVIOUS_RELEASE.read_bytes()
    record = parse_line(line)
    assert isinstance(record, CallRecord), record
    assert (record.id, record.route, record.rollout_id, record.policy, record.policy_version) == (
        "0f1e2d3c4b5a69788796a5b4c3d2e1f0", "chat", "r-spool-fixture", "default", 3)
    assert record.started_at == datetime(2026, 12, 1, 9, 30, tzinfo=timezone.utc)
    assert record.prompt_token_ids == [1, 2, 3, 4]
    assert record.choices == [ChoiceRecord(index=0, token_ids=[52, 50, 2], logprobs=[-0.25, -0.5, -0.01],
                                           finish_reason="stop")]
    assert (record.sampling, record.logprobs_mode, record.complete) == ("temperature=0.7", "processed", True)
    assert record.sampling_override is None  # a field added since takes its default


def test_every_field_the_previous_release_wrote_is_still_a_field():
    written = set(orjson.loads(PREVIOUS_RELEASE.read_bytes()))
    assert written - {field.name for field in fields(CallRecord)} == set()


def test_a_line_written_now_reads_back_as_it_was():
    record = parse_line(PREVIOUS_RELEASE.read_bytes())
    record.sampling_override = {"rule": "temperature=1.0", "asked": {"temperature": 0}, "sent": {"temperature": 1}}
    again = parse_line(encode(record))
    assert again == record


def test_a_whole_line_of_another_shape_is_kept_as_unreadable_not_dropped():
    line = orjson.dumps({**orjson.loads(PREVIOUS_RELEASE.read_bytes()), "renamed_field": 1}) + b"\n"
    kept = parse_line(line)
    assert isinstance(kept, Unreadable) and kept.line == line and "renamed_field" in kept.reason
