"""One rollout's calls in the web view (store/browse.py rollout_page) end at a byte budget as well as a count, and the
metadata comes with the first page only; a task's group (task_group) lists the newest attempts, says when it is cut,
and leaves evaluation rollouts out of the advantage. On both databases the store supports."""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import orjson
import pytest

from store import browse, events
from store.calls import write_calls
from store.models import Rollout
from store.records import CallRecord, ChoiceRecord
from store.rollout_view import PAGE_BYTES, get_rollout
from store.rollouts import create_rollout


def big_call(rollout_id: str, number: int, size: int, repeated: bool = False) -> CallRecord:
    """A call whose request holds `size` bytes of text: varied (as an agent's context is) or one repeated character
    (which Postgres compresses a hundredfold: the budget counts what is sent, not what is stored)."""
    body = ("x" * size) if repeated else (uuid.uuid4().hex * (size // 32 + 1))[:size]
    return CallRecord(id=uuid.uuid4().hex, route="chat", rollout_id=rollout_id,
                      started_at=datetime.now(timezone.utc) + timedelta(seconds=number),
                      request={"messages": [{"role": "user", "content": body}]},
                      response={"choices": [{"message": {"role": "assistant", "content": "ok"}}]},
                      prompt_token_ids=list(range(50)),
                      choices=[ChoiceRecord(0, [1, 2, 3], [-0.1, -0.2, -0.3], "stop")])


@pytest.mark.parametrize("repeated", [False, True], ids=["varied", "compressible"])
async def test_a_page_of_multi_megabyte_calls_ends_at_the_byte_budget(sessions, repeated):
    rollout_id = uuid.uuid4().hex
    async with sessions() as session, session.begin():
        await create_rollout(session, rollout_id, metadata={"note": "kept"})
        await events.add_event(session, rollout_id, "step", {"n": 1}, max_events=10)
        await write_calls(session, [big_call(rollout_id, n, 3 * 1024 * 1024, repeated) for n in range(6)])
    seen, after, pages = [], -1, []
    async with sessions() as session:
        while True:
            page = await browse.rollout_page(session, None, rollout_id, after=after, limit=200)
            body = orjson.dumps(page)
            assert len(body) < PAGE_BYTES, len(body)
            pages.append(page)
            seen += [c["seq"] for c in page["calls"]]
            if page["next"] is None:
                break
            after = page["next"]
    assert pages[0]["next"] is not None and len(pages[0]["calls"]) == 2  # 3 MiB each: two fit in 8 MiB
    assert seen == sorted(seen) and len(seen) == len(set(seen)) == 6
    assert pages[0]["rollout"]["metadata"]["note"] == "kept"
    assert [e["event_type"] for e in pages[0]["rollout"]["metadata"]["events"]] == ["step"]
    assert all("metadata" not in p["rollout"] for p in pages[1:])  # the first page's, not repeated


async def test_a_call_past_the_budget_alone_is_a_page_of_its_own(sessions):
    rollout_id = uuid.uuid4().hex
    async with sessions() as session, session.begin():
        await create_rollout(session, rollout_id)
        await write_calls(session, [big_call(rollout_id, 0, 100), big_call(rollout_id, 1, PAGE_BYTES + 10),
                                    big_call(rollout_id, 2, 100)])
    async with sessions() as session:
        first = await browse.rollout_page(session, None, rollout_id, after=-1, limit=200)
        second = await browse.rollout_page(session, None, rollout_id, after=first["next"], limit=200)
        third = await browse.rollout_page(session, None, rollout_id, after=second["next"], limit=200)
    assert [len(p["calls"]) for p in (first, second, third)] == [1, 1, 1]
    assert third["next"] is None


async def test_small_calls_page_by_count_and_the_api_route_is_unchanged(sessions):
    rollout_id = uuid.uuid4().hex
    async with sessions() as session, session.begin():
        await create_rollout(session, rollout_id)
        await write_calls(session, [big_call(rollout_id, n, 10) for n in range(25)])
    async with sessions() as session:
        whole = await get_rollout(session, rollout_id)  # GET /rollouts/{id}: no byte budget, metadata every page
        seqs = [c["seq"] for c in whole["calls"]]
        first = await browse.rollout_page(session, None, rollout_id, after=-1, limit=10)
        last = await browse.rollout_page(session, None, rollout_id, after=seqs[19], limit=10)
        exact = await browse.rollout_page(session, None, rollout_id, after=seqs[14], limit=10)
    assert len(seqs) == 25 and whole["next"] is None
    assert [c["seq"] for c in first["calls"]] == seqs[:10] and first["next"] == seqs[9]
    assert [c["seq"] for c in last["calls"]] == seqs[20:] and last["next"] is None
    assert [c["seq"] for c in exact["calls"]] == seqs[15:] and exact["next"] is None  # ends with the last call


async def add(session, task: str, n: int, *, project: str | None = "p", reward: float | None = 1.0,
              eval: bool = False, status: str = "finished") -> str:
    rollout_id = f"{task}-{n:04d}-{uuid.uuid4().hex[:6]}"
    session.add(Rollout(id=rollout_id, task_id=task, project=project, status=status, reward=reward, eval=eval,
                        call_count=0, created_at=datetime(2026, 11, 1, tzinfo=timezone.utc) + timedelta(minutes=n)))
    return rollout_id


async def test_a_task_group_is_the_newest_attempts_and_says_when_it_is_cut(sessions, monkeypatch):
    monkeypatch.setattr(browse, "MAX_GROUP", 5)
    task = "group-" + uuid.uuid4().hex[:8]
    async with sessions() as session, session.begin():
        made = [await add(session, task, n) for n in range(7)]
    async with sessions() as session:
        group = await browse.task_group(session, None, task)
    assert [a["rollout_id"] for a in group["data"]] == made[::-1][:5]
    assert group["truncated"] is True


async def test_evaluation_attempts_are_not_in_the_advantage_and_projects_are_their_own_groups(sessions):
    task = "adv-" + uuid.uuid4().hex[:8]
    async with sessions() as session, session.begin():
        one = await add(session, task, 0, reward=1.0)
        zero = await add(session, task, 1, reward=0.0)
        held_out = await add(session, task, 2, reward=0.0, eval=True)
        other = await add(session, task, 3, reward=0.0, project="q")
        running = await add(session, task, 4, reward=None, status="open")
    async with sessions() as session:
        group = await browse.task_group(session, None, task)
    by_id = {a["rollout_id"]: a for a in group["data"]}
    assert group["truncated"] is False
    # GRPO over p's two trained-kind attempts, 1 and 0: +1 and -1 (population std 0.5); the evaluation rollout's 0
    # would have made them +1.41 and -0.71
    assert by_id[one]["advantage"] == pytest.approx(1.0, abs=1e-4)
    assert by_id[zero]["advantage"] == pytest.approx(-1.0, abs=1e-4)
    assert "advantage" not in by_id[held_out] and by_id[held_out]["eval"] is True
    assert by_id[other]["advantage"] == 0.0  # alone in project q
    assert "advantage" not in by_id[running]
