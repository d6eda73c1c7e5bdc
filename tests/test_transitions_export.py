"""`rlproxy export` writes the transitions the trainer would build, row by row as it would train them: a row holds
one policy's calls only, and where the calls merged into one row earned different advantages, each token carries
its own (the row's single advantage would be made up)."""
from __future__ import annotations

import asyncio
import io
import json
import uuid

from store import rollouts as store_rollouts
from store.calls import write_calls
from store.db import open_database, session_factory
from store.models import utcnow
from store.records import CallRecord, ChoiceRecord
from trainer import export

PROMPT = [11, 12, 13]


def record(rollout_id: str, agent: str, policy: str, prompt: list[int], completion: list[int]) -> CallRecord:
    return CallRecord(id=uuid.uuid4().hex, route="chat", started_at=utcnow(), rollout_id=rollout_id, agent=agent,
                      task_id="shared-transcript", policy_version=0, policy=policy, prompt_token_ids=prompt,
                      choices=[ChoiceRecord(0, completion, [-0.5] * len(completion), "stop")])


async def shared_transcript(database_url: str, reward: float, call_reward: float | None) -> list[CallRecord]:
    """A planner (policy `planner`) and a coder (policy `coder`) reading one transcript: each prompt is the whole
    conversation so far, the planner's reply included. The planner speaks twice; its second turn may carry a
    reward of its own."""
    rollout_id = uuid.uuid4().hex
    plan = record(rollout_id, "planner", "planner", PROMPT, [21, 22, 2])
    code = record(rollout_id, "coder", "coder", PROMPT + [21, 22, 2, 5], [31, 32, 2])
    check = record(rollout_id, "planner", "planner", PROMPT + [21, 22, 2, 5, 31, 32, 2, 6], [41, 2])
    database = open_database(database_url)
    sessions = session_factory(database)
    for call in (plan, code, check):  # one at a time, as the agents made them
        async with sessions() as session, session.begin():
            await write_calls(session, [call])
    async with sessions() as session, session.begin():
        if call_reward is not None:
            await store_rollouts.post_reward(session, rollout_id, call_reward, call_id=check.id)
        await store_rollouts.post_reward(session, rollout_id, reward, task_id="shared-transcript")
    await database.dispose()
    return [plan, code, check]


def exported(database_url: str) -> list[dict]:
    out = io.BytesIO()
    asyncio.run(export.export_transitions(database_url, out))
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_each_row_holds_one_policys_tokens_and_each_token_its_own_advantage(own_database_url):
    plan, code, check = asyncio.run(shared_transcript(own_database_url, 1.0, call_reward=0.5))
    asyncio.run(shared_transcript(own_database_url, 0.0, call_reward=None))
    rows = [row for row in exported(own_database_url) if plan.id in row["call_ids"] or code.id in row["call_ids"]
            or check.id in row["call_ids"]]

    assert sorted(row["call_ids"] for row in rows) == sorted([[plan.id, check.id], [code.id]])
    planner, coder = sorted(rows, key=lambda row: len(row["call_ids"]), reverse=True)
    assert (planner["policy_name"], coder["policy_name"]) == ("planner", "coder")
    trained = [t for t, keep in zip(planner["completion_ids"], planner["loss_mask"]) if keep]
    assert trained == [21, 22, 2, 41, 2]  # the coder's reply is context in the planner's row

    group_advantage = coder["advantage"]  # the episode's advantage within its group (GRPO over 1.0 and 0.0)
    assert group_advantage > 0 and coder["token_advantages"] == [group_advantage] * 3
    assert planner["advantage"] is None  # its two calls earned different advantages
    expected = [group_advantage] * 3 + [0.0] * 5 + [group_advantage + 0.5] * 2
    assert planner["token_advantages"] == expected
