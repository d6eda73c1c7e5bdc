"""What the trainer's tests share: the training core built on the tiny model with one update a step, an on-policy
batch for it, and, for runs of the whole worker, the store's view of a run (rollouts trained, leased and stepped,
the versions) waited on, and whether an adapter folder is complete. torch is imported where it is used: the tests
that import this skip themselves without it."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

from sqlalchemy import func, select

from core.settings import TrainingSettings
from store.db import open_database, session_factory
from store.models import Policy, Rollout, TrainStep
from tests.conftest import TINY_VOCAB as VOCAB
from trainer.transitions import Transition

SMALL_STEPS = {"batch_rollouts": 4, "max_batch_rollouts": 4, "group_size": 4, "micro_batch_tokens": 256}  # a step: one group


async def snapshot(database_url: str) -> dict:
    database = open_database(database_url)
    async with session_factory(database)() as session:
        trained = await session.scalar(select(func.count()).where(Rollout.trained_at.is_not(None)))
        leased = await session.scalar(select(func.max(Rollout.lease_expires_at)))  # the newest claim
        stepped = await session.scalar(select(func.coalesce(func.sum(TrainStep.rollout_count), 0)))
        policies = (await session.execute(select(Policy).order_by(Policy.version))).scalars().all()
    await database.dispose()
    return {"trained": trained, "leased": leased, "stepped": stepped,
            "policies": [(p.version, p.status, p.path) for p in policies],
            "names": {p.version: p.name for p in policies}}  # the adapter name each version's row keeps


def wait_for(database_url: str, condition, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = asyncio.run(snapshot(database_url))
        if condition(state):
            return state
        time.sleep(0.05)
    raise TimeoutError(f"trainer state never reached the condition: {state}")


def is_complete_adapter(folder: str | Path) -> bool:
    folder = Path(folder)
    return all((folder / name).is_file() and (folder / name).stat().st_size > 0
               for name in ("adapter_config.json", "adapter_model.safetensors"))


def make_trainer(path: str, adapter_dir=None, **overrides):
    from trainer.ppo import PolicyTrainer

    # one AdamW update per step unless a test asks for more: ratios and clipping are read against that one update
    settings = {"learning_rate": 1e-3, "micro_batch_tokens": 40, "kl_coef": 0.01, "mini_batches": 1, **overrides}
    return PolicyTrainer(path, TrainingSettings(**settings), adapter_dir=adapter_dir)


def on_policy_batch(trainer, n: int = 4, prompt_len: int = 10, completion_len: int = 6) -> list[Transition]:
    """Fixed random sequences, alternating +1/-1 advantages, behaviour log-probs = current policy's."""
    import torch

    g = torch.Generator().manual_seed(7)
    batch = [
        Transition(
            prompt_ids=torch.randint(0, VOCAB, (prompt_len + i,), generator=g).tolist(),
            completion_ids=torch.randint(0, VOCAB, (completion_len,), generator=g).tolist(),
            behaviour_logprobs=[0.0] * completion_len,
            advantage=1.0 if i % 2 == 0 else -1.0,
        )
        for i in range(n)
    ]
    for t, lp in zip(batch, trainer.logprobs(batch)):
        t.behaviour_logprobs = lp
    return batch
