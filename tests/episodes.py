"""Episodes written into a database as the proxy records them (multi-turn calls linked by exact prefixes, a final
reward each), for the trainer's tests: the worker, its faults, operator changes, parallel ranks, export, adapter
retention."""
from __future__ import annotations

import random
import uuid

from store import rollouts as store_rollouts
from store.calls import write_calls
from store.db import open_database, session_factory
from store.models import utcnow
from store.records import CallRecord, ChoiceRecord
from tests.conftest import TINY_VOCAB as VOCAB


async def record_episodes(database_url: str, groups: int, group_size: int, *, calls: int = 2,
                          task_prefix: str = "task", call_agent: str | None = "solver",
                          rollout_agent: str | None = None, version: int = 0) -> list[str]:
    """Episodes as the proxy records them (multi-turn, exact prefix links), each with a final reward."""
    rng = random.Random(0)
    database = open_database(database_url)
    sessions = session_factory(database)
    ids = []
    for g in range(groups):
        for member in range(group_size):
            rollout_id = uuid.uuid4().hex
            if rollout_agent is not None:  # as `POST /rollouts {"agent": ...}` does
                async with sessions() as session, session.begin():
                    await store_rollouts.create_rollout(session, rollout_id, task_id=f"{task_prefix}-{g}",
                                                        agent=rollout_agent)
            prompt = [rng.randrange(3, VOCAB) for _ in range(12)]
            records = []
            for _ in range(calls):
                completion = [rng.randrange(3, VOCAB) for _ in range(5)] + [2]
                records.append(CallRecord(
                    id=uuid.uuid4().hex, route="chat", started_at=utcnow(), rollout_id=rollout_id, agent=call_agent,
                    task_id=f"{task_prefix}-{g}", policy_version=version, prompt_token_ids=list(prompt),
                    choices=[ChoiceRecord(0, completion, [-1.0] * len(completion), "stop")]))
                prompt = prompt + completion + [rng.randrange(3, VOCAB) for _ in range(4)]
            async with sessions() as session, session.begin():
                await write_calls(session, records)
            async with sessions() as session, session.begin():
                await store_rollouts.post_reward(session, rollout_id, float(member % 2), task_id=f"{task_prefix}-{g}")
            ids.append(rollout_id)
    await database.dispose()
    return ids
