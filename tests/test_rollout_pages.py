"""`GET /rollouts/{id}` pages by bytes as well as by count (a page of multi-MiB calls ends at the web view's
PAGE_BYTES), and `?calls=false` answers what the calls came to without any of them (what `rlproxy run` reads at
each attempt's end, on `--resume` and while pacing)."""
from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta, timezone

import requests

from store.calls import write_calls
from store.records import CallRecord, ChoiceRecord
from store.rollout_view import PAGE_BYTES
from tests.support import transaction

MIB = 1024 * 1024


def large_call(rollout_id: str, number: int, size: int, *, policy: int | None = None, status: str = "ok",
               http_status: int = 200) -> CallRecord:
    body = (uuid.uuid4().hex * (size // 32 + 1))[:size]
    return CallRecord(id=uuid.uuid4().hex, route="chat", rollout_id=rollout_id, status=status,
                      http_status=http_status, policy_version=policy,
                      started_at=datetime.now(timezone.utc) + timedelta(seconds=number),
                      request={"messages": [{"role": "user", "content": body}]},
                      response={"choices": [{"message": {"role": "assistant", "content": "ok"}}]},
                      prompt_token_ids=list(range(50)),
                      choices=[ChoiceRecord(0, [1, 2, 3], [-0.1, -0.2, -0.3], "stop")])


def store(database_url: str, records: list[CallRecord]) -> None:
    async def go() -> None:
        async with transaction(database_url) as session:
            await write_calls(session, records)

    asyncio.run(go())


def test_a_rollout_of_large_calls_is_read_in_pages_of_bounded_bytes(proxy_url, database_url):
    rollout_id = uuid.uuid4().hex
    store(database_url, [large_call(rollout_id, n, 3 * MIB) for n in range(5)])

    first = requests.get(f"{proxy_url}/rollouts/{rollout_id}", timeout=30)
    assert first.status_code == 200
    assert len(first.content) < PAGE_BYTES  # was one answer of every call: 15 MiB here, 92 MiB in the probe
    page = first.json()
    assert len(page["calls"]) == 2 and page["next"] == page["calls"][-1]["seq"]
    seqs = [c["seq"] for c in page["calls"]]
    while page["next"] is not None:
        answer = requests.get(f"{proxy_url}/rollouts/{rollout_id}", params={"after": page["next"]}, timeout=30)
        assert len(answer.content) < PAGE_BYTES
        page = answer.json()
        seqs += [c["seq"] for c in page["calls"]]
    assert seqs == [1, 2, 3, 4, 5]
    small = requests.get(f"{proxy_url}/rollouts/{rollout_id}", params={"limit": 1}, timeout=30).json()
    assert len(small["calls"]) == 1 and small["next"] == 1  # ?limit= bounds it further, as before


def test_the_summary_form_reads_no_call(proxy_url, database_url):
    rollout_id = uuid.uuid4().hex
    store(database_url, [large_call(rollout_id, 0, MIB, policy=0), large_call(rollout_id, 1, MIB, policy=3),
                         large_call(rollout_id, 2, MIB, policy=3, status="upstream_error", http_status=502)])

    answer = requests.get(f"{proxy_url}/rollouts/{rollout_id}", params={"calls": "false"}, timeout=30)
    assert answer.status_code == 200 and len(answer.content) < 4096
    summary = answer.json()
    assert summary["calls"] == [] and summary["next"] is None and summary["status"] == "open"
    assert summary["summary"] == {
        "call_count": 3,
        "policies": [{"policy": 0, "calls": 1, "first_seq": 1, "last_seq": 1},
                     {"policy": 3, "calls": 2, "first_seq": 2, "last_seq": 3}],
        "statuses": [{"status": "ok", "http_status": 200, "calls": 2},
                     {"status": "upstream_error", "http_status": 502, "calls": 1}],
    }
    assert "summary" not in requests.get(f"{proxy_url}/rollouts/{rollout_id}", timeout=30).json()
    refused = requests.get(f"{proxy_url}/rollouts/{rollout_id}", params={"calls": "no"}, timeout=30)
    assert refused.status_code == 422 and refused.json()["error"]["param"] == "calls"
