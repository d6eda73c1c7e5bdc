"""`rlproxy export` writes what was recorded as training transitions, for pipelines outside rlproxy."""
from __future__ import annotations

import json
import subprocess
import sys

import openai
import requests


def test_export_writes_one_transition_per_rewarded_call_with_exact_ids(proxy_url, database_url, tmp_path):
    expected = {}
    for reward in (1.0, 0.0):
        created = requests.post(f"{proxy_url}/rollouts", json={"task_id": "export-task"}).json()
        client = openai.OpenAI(base_url=created["base_url"], api_key="unused")
        client.chat.completions.create(model="stub-model", messages=[{"role": "user", "content": "hi"}])
        requests.post(f"{proxy_url}/reward", json={"rollout_id": created["rollout_id"], "reward": reward})
        expected[created["rollout_id"]] = requests.get(f"{proxy_url}/rollouts/{created['rollout_id']}").json()

    out = tmp_path / "transitions.jsonl"
    done = subprocess.run([sys.executable, "-m", "rlproxy.cli", "export", "--database-url", database_url,
                           "--out", str(out)], capture_output=True, text=True, check=True)
    assert "transitions" in done.stdout
    rows = {row["rollout_id"]: row for row in map(json.loads, out.read_text().splitlines())}
    for rollout_id, rollout in expected.items():
        [call] = rollout["calls"]
        row = rows[rollout_id]
        assert row["prompt_ids"] == call["prompt_token_ids"]
        assert row["completion_ids"] == call["completion_token_ids"]
        assert row["completion_text"] == [call["response"]["choices"][0]["message"]["content"]]
        assert row["reward"] == rollout["reward"] and row["policy"] == 0
    [good, bad] = [rows[r]["advantage"] for r in expected]
    assert good > 0 > bad  # GRPO within the task group


def test_export_reads_responses_and_messages_calls_like_chat(proxy_url, database_url, tmp_path):
    import anthropic

    expected = {}
    for reward in (1.0, 0.0):
        created = requests.post(f"{proxy_url}/rollouts", json={"task_id": "export-dialects"}).json()
        openai.OpenAI(base_url=created["base_url"], api_key="unused").responses.create(
            model="stub-model", input=f"first {reward}")
        anthropic.Anthropic(base_url=created["base_url"].removesuffix("/v1"), api_key="unused").messages.create(
            model="stub-model", max_tokens=16, messages=[{"role": "user", "content": f"second {reward}"}])
        requests.post(f"{proxy_url}/reward", json={"rollout_id": created["rollout_id"], "reward": reward})
        expected[created["rollout_id"]] = requests.get(f"{proxy_url}/rollouts/{created['rollout_id']}").json()

    out = tmp_path / "transitions.jsonl"
    subprocess.run([sys.executable, "-m", "rlproxy.cli", "export", "--database-url", database_url,
                    "--out", str(out)], capture_output=True, text=True, check=True)
    rows = [row for row in map(json.loads, out.read_text().splitlines()) if row["rollout_id"] in expected]
    texts = {c["call_id"]: (c["response"].get("output") or [{"content": c["response"].get("content")}])[0]
             ["content"][0]["text"] for r in expected.values() for c in r["calls"]}
    assert len(rows) == 4  # two calls per rollout, each its own transition (the prompts do not extend each other)
    for row in rows:
        [call_id] = row["call_ids"]
        [call] = [c for r in expected.values() for c in r["calls"] if c["call_id"] == call_id]
        assert row["prompt_ids"] == call["prompt_token_ids"] and row["completion_ids"] == call["completion_token_ids"]
        assert row["completion_text"] == [texts[call_id]]
        assert (row["advantage"] > 0) == (row["reward"] == 1.0)


def test_export_pages_hold_whole_groups_and_every_rollout_once(own_database_url, monkeypatch):
    """Pages of one group each: a group split between two pages would be given two baselines. Each group's
    advantages are its own (GRPO: they sum to zero), and no rollout is missed or written twice."""
    import asyncio
    import io
    from collections import defaultdict

    from tests.episodes import record_episodes
    from trainer import export

    ids = asyncio.run(record_episodes(own_database_url, groups=3, group_size=4, calls=1))
    monkeypatch.setattr(export, "GROUPS_PER_PAGE", 1)
    out = io.BytesIO()
    written = asyncio.run(export.export_transitions(own_database_url, out))
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    assert written == len(rows) == 12 and sorted(row["rollout_id"] for row in rows) == sorted(ids)
    by_group = defaultdict(list)
    for index, row in enumerate(rows):
        by_group[ids.index(row["rollout_id"]) // 4].append(row["advantage"])
    assert all(abs(sum(advantages)) < 1e-6 and len(advantages) == 4 for advantages in by_group.values())


def test_rows_without_a_finish_time_do_not_stop_the_export(own_database_url):
    """Rows written by hand or by an older version: finished, no finish time. They are exported, last."""
    import asyncio
    import io

    from store.db import open_database, session_factory
    from store.models import Rollout, RolloutStatus
    from trainer import export

    async def plant() -> None:
        database = open_database(own_database_url)
        async with session_factory(database)() as session, session.begin():
            for n in range(3):
                session.add(Rollout(id=f"undated-{n}", task_id="undated", status=RolloutStatus.FINISHED, reward=1.0))
        await database.dispose()

    asyncio.run(plant())
    assert asyncio.run(export.export_transitions(own_database_url, io.BytesIO())) == 0  # no calls: no transitions
