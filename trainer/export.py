"""`rlproxy export`: recorded, rewarded rollouts as JSON lines of transitions — prompt and completion ids,
the completion text, reward, advantage (per row, and per completion token) and policy — for SFT/DPO pipelines
outside rlproxy. Rows are built as the trainer builds them, one named policy at a time (docs/training.md)."""
from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO

import orjson

from core.settings import TrainingSettings
from core.text import completion_text
from store.db import open_database, session_factory
from store.calls import completion_responses
from store.training import finished_groups, finished_in_groups, finished_without_task, load_rollouts
from trainer.batch import build_transitions
from trainer.transitions import SkipReasons

PAGE = 200
GROUPS_PER_PAGE = 25  # about PAGE rollouts in groups of 8


async def export_transitions(database_url: str, out: IO[bytes], *, config: TrainingSettings | None = None,
                             include_trained: bool = True) -> int:
    """Write one JSON object per transition to `out`; returns how many."""
    config = config or TrainingSettings(max_staleness=10**9)
    database = open_database(database_url)
    sessions = session_factory(database)
    written = 0
    try:
        async for ids in _pages(sessions, include_trained):
            async with sessions() as session:
                rollouts = await load_rollouts(session, ids)
                texts = await _completion_texts(session, ids)
            rewards = {r.id: r.reward for r in rollouts}
            for policy, t in _transitions(rollouts, config):
                out.write(orjson.dumps({
                    "rollout_id": t.rollout_id, "call_ids": t.call_ids, "policy": t.policy_version,
                    "policy_name": policy,
                    "prompt_ids": t.prompt_ids, "completion_ids": t.completion_ids,
                    "loss_mask": t.mask(), "behaviour_logprobs": t.behaviour_logprobs,
                    "completion_text": [texts.get(c) for c in t.call_ids],
                    "reward": rewards.get(t.rollout_id),
                    # A merged row's calls may have earned different advantages (discounted credit, a call's own
                    # rewards): one number would be a made-up one, so it is null there and the tokens say.
                    "advantage": t.advantage if t.token_advantages is None else None,
                    "token_advantages": [a if m else 0.0 for a, m in zip(t.advantages(), t.mask())],
                }) + b"\n")
                written += 1
        return written
    finally:
        await database.dispose()


def _transitions(rollouts, config: TrainingSettings):
    """(policy name, transition) for every named policy that answered a call: as the trainer builds them, each
    policy's apart, so a row never holds tokens of two policies (or of the base model beside a policy's)."""
    names = sorted({call.policy for rollout in rollouts for call in rollout.calls if call.policy is not None})
    for name in names:
        for t in build_transitions(rollouts, config, active_version=0, skips=SkipReasons(), keep_zero=True,
                                   policy=name):
            yield name, t


async def _pages(sessions, include_trained: bool) -> AsyncIterator[list[str]]:
    """The rollouts to export, a page at a time: whole (project, task) groups first (a group split between
    pages would get two baselines), then the rollouts with no task. Keyed pages: rollouts trained or stored
    while the export runs neither skip nor repeat one."""
    after_group = None
    while True:
        async with sessions() as session:
            groups = await finished_groups(session, include_trained=include_trained, after=after_group,
                                           limit=GROUPS_PER_PAGE)
            ids = await finished_in_groups(session, groups, include_trained=include_trained)
        if not groups:
            break
        after_group = (groups[-1][0] or "", groups[-1][1])
        if ids:
            yield ids
    after_row = None
    while True:
        async with sessions() as session:
            rows = await finished_without_task(session, include_trained=include_trained, after=after_row,
                                               limit=PAGE)
        if not rows:
            return
        after_row = rows[-1]
        yield [rollout_id for _, rollout_id in rows]


async def _completion_texts(session, rollout_ids: list[str]) -> dict[str, str | None]:
    return {call_id: completion_text(route, response)
            for call_id, route, response in await completion_responses(session, rollout_ids)}


def export_to_file(database_url: str, path: Path, **kwargs) -> int:
    # this user's only (0600): every project's completions and rewards, as the database holds them
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600), "wb") as out:
        return asyncio.run(export_transitions(database_url, out, **kwargs))
