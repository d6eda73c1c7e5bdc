"""Calls are trained as they were sampled: a call at temperature 0.7 with top_p / top_k is scored by the trainer at
those settings, so its log-probs agree with the engine's processed ones at lag 0; a greedy task group fires the
ALERT that says what to set; what the trainer decided is stored on each call; a long call is kept.

A tiny random model, real Postgres and the stub engine process, as in test_served_agreement.py. The engine's
sampling is stood in for by a plain computation (logits / T, top-k, top-p, renormalised), independent of the
trainer's own code, which draws each token and records its log-prob as `processed_logprobs` does."""
from __future__ import annotations

import asyncio
import logging
import random
import uuid

import pytest
from sqlalchemy import select

from core.settings import TrainerSettings, TrainingSettings
from store import rollouts as store_rollouts
from store.calls import write_calls
from store.db import open_database, session_factory
from store.models import Call, utcnow
from store.records import CallRecord, ChoiceRecord

torch = pytest.importorskip("torch")
from tests.conftest import TINY_VOCAB as VOCAB  # noqa: E402

pytestmark = pytest.mark.train
GROUP_SIZE = 4
TEMPERED = "temperature=0.7 top_p=0.95 top_k=20"
BOUND = 1e-4  # float32 on both sides: the trainer and the stand-in agree to rounding


def engine_sample(model, prompt: list[int], steps: int, rng: torch.Generator, *, temperature: float, top_p: float,
                  top_k: int, recorded: str) -> tuple[list[int], list[float]]:
    """Draw `steps` tokens from the tempered, truncated distribution; record the log-prob of each as the engine
    would (`recorded`: 'processed', the distribution drawn from, or 'raw', log-softmax at temperature 1)."""
    ids, logprobs = list(prompt), []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            z = logits / temperature
            kth = z.topk(top_k).values[-1]
            z = z.masked_fill(z < kth, float("-inf"))
            p = z.softmax(-1)
            ordered, order = p.sort(descending=True)
            cut = order[(ordered.cumsum(0) - ordered) >= top_p]
            z[cut] = float("-inf")
            processed = z.log_softmax(-1)
            token = int(torch.multinomial(processed.exp(), 1, generator=rng))
            ids.append(token)
            logprobs.append(float(processed[token] if recorded == "processed" else logits.log_softmax(-1)[token]))
    return ids[len(prompt):], logprobs


async def record_group(database_url: str, task: str, calls: list[tuple[list[int], list[int], list[float]]],
                       *, sampling: str | None, version: int = 0, logprobs_mode: str | None = "processed") -> list[str]:
    """One rollout per call, rewarded 1, 0, 1, 0, ...; the call ids."""
    db = open_database(database_url)
    sessions = session_factory(db)
    ids = []
    for member, (prompt, completion, logprobs) in enumerate(calls):
        rollout_id, call_id = uuid.uuid4().hex, uuid.uuid4().hex
        record = CallRecord(id=call_id, route="chat", started_at=utcnow(), rollout_id=rollout_id, agent="solver",
                            task_id=task, policy_version=version, prompt_token_ids=prompt, sampling=sampling,
                            logprobs_mode=logprobs_mode,
                            choices=[ChoiceRecord(0, completion, logprobs, "stop")])
        async with sessions() as session, session.begin():
            await write_calls(session, [record])
        async with sessions() as session, session.begin():
            await store_rollouts.post_reward(session, rollout_id, float(1 - member % 2), task_id=task)
        ids.append(call_id)
    await db.dispose()
    return ids


def one_step(database_url: str, stub_url: str, model_path, adapters, record,
             batch: int = GROUP_SIZE) -> tuple[object, dict[str, str]]:
    """Start a trainer, let `record(worker)` store the calls, take one step; (worker, call id -> decision)."""
    from trainer.worker import TrainerWorker

    settings = TrainerSettings(database_url=database_url, upstreams=(stub_url,), adapters_dir=adapters,
                               metrics_port=None, worker_id="sampled-trainer",
                               training=TrainingSettings(batch_rollouts=batch, group_size=GROUP_SIZE,
                                                         micro_batch_tokens=512, bf16=False))

    async def run():
        worker = TrainerWorker(settings, model_path)
        await worker.start()
        try:
            await record(worker)
            assert await worker.step_once()
            async with worker.sessions() as session:
                rows = (await session.execute(select(Call.id, Call.train_decision))).all()
            return worker, dict(rows)
        finally:
            await worker.database.dispose()

    return asyncio.run(run())


def latest_step(worker) -> dict:
    from store.models import TrainStep

    async def read():
        async with worker.sessions() as session:
            return (await session.execute(select(TrainStep).order_by(TrainStep.id.desc()))).scalars().first().metrics
    return asyncio.run(read())


@pytest.mark.parametrize("recorded", ["processed", "raw"])
def test_a_tempered_truncated_call_is_trained_at_its_own_settings_and_agrees_at_lag_0(
        recorded, tiny_model, own_database_url, stub_url, tmp_path):
    """Scored at T=0.7, top_p 0.95, top_k 20, the engine's processed log-probs agree with the trainer's; the same
    tokens recorded with raw log-probs (what the engine returned before) do not: that is what the bound tells."""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model, torch_dtype=torch.float32).eval()
    rng, seeds = torch.Generator().manual_seed(0), random.Random(0)
    calls = []
    for _ in range(GROUP_SIZE):
        prompt = [seeds.randrange(3, VOCAB) for _ in range(8)]
        calls.append((prompt, *engine_sample(base, prompt, 6, rng, temperature=0.7, top_p=0.95, top_k=20,
                                             recorded=recorded)))
    called: list[str] = []

    async def record(worker):
        called.extend(await record_group(own_database_url, "tempered", calls, sampling=TEMPERED))

    worker, decisions = one_step(own_database_url, stub_url, tiny_model, tmp_path, record)
    step = latest_step(worker)
    assert step["calls_seen"] == step["calls_trained"] == GROUP_SIZE
    assert step["agents"]["solver"] == {"calls_seen": GROUP_SIZE, "calls_trained": GROUP_SIZE, "skipped": {}}
    assert [decisions[c] for c in called] == ["trained"] * GROUP_SIZE
    assert step["agreement_tokens"] == GROUP_SIZE * 6
    if recorded == "processed":
        assert step["agreement_kl"] < BOUND
    else:
        assert step["agreement_kl"] > 100 * BOUND
    assert worker.metrics.calls_trained.labels("default", "solver")._value.get() == GROUP_SIZE


def test_a_greedy_group_fires_one_alert_naming_the_setting_and_each_call_keeps_its_reason(
        tiny_model, own_database_url, stub_url, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="rlproxy.trainer")
    prompt, completion = [5, 6, 7, 8], [9, 10, 11]
    called: list[str] = []

    async def record(worker):
        same = [(prompt, completion, [-0.1, -0.2, -0.3])] * GROUP_SIZE  # temperature 0: one attempt repeated
        called.extend(await record_group(own_database_url, "greedy", same, sampling="temperature=0"))

    worker, decisions = one_step(own_database_url, stub_url, tiny_model, tmp_path, record)
    alerts = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ALERT")]
    assert len(alerts) == 1, alerts
    assert "cannot learn" in alerts[0] and "--rollout-sampling policy:default/temperature=1.0" in alerts[0]
    assert [decisions[c] for c in called] == ["greedy_sampling"] * GROUP_SIZE
    step = latest_step(worker)
    assert step["policies"]["default"]["calls_skipped"] == {"greedy_sampling": GROUP_SIZE}
    assert worker.metrics.yield_alerts.labels("default", "greedy")._value.get() == 1
    assert worker.metrics.calls_skipped.labels("default", "solver", "greedy_sampling")._value.get() == GROUP_SIZE


def test_a_call_longer_than_a_micro_batch_is_trained_with_the_engines_max_model_len(
        tiny_model, own_database_url, stub_url, tmp_path):
    """max_seq_len 0 reads the stub engine's max_model_len (4096); a 700-token call (past micro_batch_tokens 512
    tokens) is trained as a micro-batch of its own, not dropped."""
    seeds = random.Random(1)
    long_prompt = [seeds.randrange(3, VOCAB) for _ in range(700)]
    calls = [(long_prompt if i == 0 else long_prompt[:20], [seeds.randrange(3, VOCAB) for _ in range(4)],
              [-6.0] * 4) for i in range(GROUP_SIZE)]
    called: list[str] = []

    async def record(worker):
        assert worker.settings.training.max_seq_len == 4096
        called.extend(await record_group(own_database_url, "long", calls, sampling=None))

    worker, decisions = one_step(own_database_url, stub_url, tiny_model, tmp_path, record)
    assert decisions[called[0]] == "trained"
    assert latest_step(worker)["calls_trained"] == GROUP_SIZE


def test_a_tempered_call_recorded_before_the_logprobs_mode_column_keeps_its_meaning(
        tiny_model, own_database_url, stub_url, tmp_path):
    """A row without `logprobs_mode` (recorded before migration 0016) holds raw log-probs: its tempered calls are
    still skipped as sampling_altered, with that reason stored, and its temperature-1 calls trained."""
    seeds = random.Random(2)
    calls = [([seeds.randrange(3, VOCAB) for _ in range(8)], [seeds.randrange(3, VOCAB) for _ in range(3)],
              [-6.0] * 3) for _ in range(GROUP_SIZE)]
    tempered: list[str] = []
    plain: list[str] = []

    async def record(worker):
        tempered.extend(await record_group(own_database_url, "old", calls, sampling=TEMPERED, logprobs_mode=None))
        plain.extend(await record_group(own_database_url, "old-plain", calls, sampling=None, logprobs_mode=None))

    worker, decisions = one_step(own_database_url, stub_url, tiny_model, tmp_path, record, batch=2 * GROUP_SIZE)
    assert [decisions[c] for c in tempered] == ["sampling_altered"] * GROUP_SIZE
    assert [decisions[c] for c in plain] == ["trained"] * GROUP_SIZE
