"""The trainer across processes, run as on GPUs but with CPU processes: torchrun starts the ranks, FSDP2 shards the
frozen base over them (trainer/sharding.py), torch.distributed (gloo here, NCCL on GPUs) moves the shards and sums
the LoRA gradients. Sharding changes nothing but memory: two ranks make the update one process makes."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import requests

from tests.support import ROOT, free_port, running, stub_command, trainer_command
from tests.trainer_support import SMALL_STEPS, is_complete_adapter, snapshot, wait_for
from tests.episodes import record_episodes
from tests.conftest import TINY_VOCAB

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.train

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
# float32: the ranks sum their gradients in another order than one process adds its micro-batches; that and the
# reduction order of the norms is all that differs (measured: 8e-7 on LoRA weights of about 0.04).
FLOAT32 = {"rtol": 1e-4, "atol": 1e-6}
# bfloat16 rounds every product to 8 bits of mantissa, so the order of the sums shows, and AdamW's first updates
# are about lr x sign(gradient): a gradient near zero whose sign the rounding flips moves its weight by 2 x lr the
# other way. Element-wise tolerances cannot hold; each tensor as a whole does: measured on a CPU with AMX, 2-5% of
# the elements flipped and each tensor differed by at most 6% of its norm. The float32 test above is the exact one.
BFLOAT16_RELATIVE_NORM = 0.1


def train(model, out, *args: str, ranks: int | None = None) -> None:
    """tests/parallel_step.py alone (ranks None: the model unsharded) or under torchrun on `ranks` ranks."""
    launcher = [sys.executable] if ranks is None else [*TORCHRUN, "--nproc-per-node", str(ranks)]
    subprocess.run([*launcher, "tests/parallel_step.py", str(model), str(out), *args], cwd=ROOT, check=True)


def adapter(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


def assert_same_update(one, two, tolerance=None, relative_norm: float | None = None) -> None:
    """Element-wise within `tolerance`, or each tensor within `relative_norm` of its norm."""
    assert one.keys() == two.keys()
    assert max(float(t.abs().max()) for name, t in one.items() if "lora_B" in name) > 1e-3  # it did learn
    for name in one:
        if relative_norm is None:
            torch.testing.assert_close(two[name], one[name], **tolerance, msg=name)
        else:
            difference = float((two[name].float() - one[name].float()).norm() / one[name].float().norm())
            assert difference <= relative_norm, (name, difference)


@pytest.fixture(scope="module")
def first_steps(tiny_model, tmp_path_factory):
    """The same batch trained by one process (two steps) and by two ranks sharing the base (one step): their
    output folders."""
    alone, shared = tmp_path_factory.mktemp("alone"), tmp_path_factory.mktemp("two-ranks")
    train(tiny_model, alone, "--steps", "2")
    train(tiny_model, shared, ranks=2)
    return alone, shared


def test_the_base_sharded_over_two_ranks_makes_the_same_update_as_one_process(first_steps):
    alone, shared = first_steps
    assert_same_update(adapter(alone / "step-1"), adapter(shared / "step-1"), FLOAT32)
    one_optimizer, two_optimizer = (torch.load(folder / "step-1" / "optimizer.pt") for folder in (alone, shared))
    for index, moments in one_optimizer["state"].items():  # saved whole by either: one file format
        torch.testing.assert_close(two_optimizer["state"][index]["exp_avg"], moments["exp_avg"], **FLOAT32)

    one_metrics, two_metrics = (json.loads((folder / "metrics-1.json").read_text()) for folder in (alone, shared))
    assert two_metrics["trained_tokens"] == one_metrics["trained_tokens"]
    assert two_metrics["tokens"] == one_metrics["tokens"]  # every transition computed once, by one of the ranks
    assert two_metrics["updates"] == one_metrics["updates"] == 4  # 2 epochs x 2 mini-batches
    for name in ("loss", "policy_loss", "kl", "clip_fraction", "entropy", "grad_norm"):
        assert two_metrics[name] == pytest.approx(one_metrics[name], rel=1e-4, abs=1e-7), name
    torch.testing.assert_close(torch.tensor(two_metrics["logprobs"][0]), torch.tensor(one_metrics["logprobs"][0]),
                               **FLOAT32)

    whole = json.loads((alone / "rank-0.json").read_text())
    assert whole["local"] == whole["whole"]
    for rank in (0, 1):  # each rank stores half of the base (and of the LoRA parameters), a little padding aside
        held = json.loads((shared / f"rank-{rank}.json").read_text())
        assert held["whole"] == whole["whole"] and held["local"] <= 0.51 * whole["whole"], held


def test_two_replicas_of_the_whole_base_make_the_same_update_as_one_process(first_steps, tiny_model, tmp_path):
    alone, _ = first_steps
    train(tiny_model, tmp_path, "--mesh", "ddp", ranks=2)  # a 2-D mesh of two replicas, one shard each
    assert_same_update(adapter(alone / "step-1"), adapter(tmp_path / "step-1"), FLOAT32)
    for rank in (0, 1):  # nothing sharded: each rank holds all of it
        held = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert held["local"] == held["whole"], held


def test_an_adapter_saved_by_one_process_resumes_on_two_ranks_as_it_would_alone(first_steps, tiny_model, tmp_path):
    alone, _ = first_steps
    train(tiny_model, tmp_path, "--resume", str(alone / "step-1"), ranks=2)  # each rank takes its shard of the files
    # The adapter and AdamW moments one process saved, continued by two ranks: the update one process made next.
    assert_same_update(adapter(alone / "step-2"), adapter(tmp_path / "step-1"), FLOAT32)
    assert json.loads((tmp_path / "step-1" / "trainer_state.json").read_text())["step"] == 2


def test_in_bfloat16_two_ranks_make_the_same_update_as_one_process(tiny_model, tmp_path):
    from core.hardware import fast_bf16

    if not fast_bf16():
        pytest.skip("the trainer computes in bfloat16 only where the machine does it fast (CUDA, AVX512-BF16, AMX)")
    train(tiny_model, tmp_path / "alone", "--bf16")
    train(tiny_model, tmp_path / "shared", "--bf16", ranks=2)
    assert_same_update(adapter(tmp_path / "alone" / "step-1"), adapter(tmp_path / "shared" / "step-1"),
                       relative_norm=BFLOAT16_RELATIVE_NORM)


def test_a_rank_killed_mid_training_stops_every_rank_and_leaves_only_whole_adapters(tiny_model, tmp_path):
    import psutil

    out = tmp_path / "adapters"
    job = subprocess.Popen([*TORCHRUN, "--nproc-per-node", "2", "tests/parallel_step.py", str(tiny_model), str(out),
                            "--steps", "1000"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not (out / "step-2").exists():  # saving after every step: a kill often lands inside a save
            assert job.poll() is None and time.monotonic() < deadline, "the job did not get to its second step"
            time.sleep(0.05)
        ranks = {p.environ().get("RANK"): p for p in psutil.Process(job.pid).children(recursive=True)
                 if p.environ().get("RANK")}
        ranks["1"].kill()
        assert job.wait(timeout=60) != 0  # rank 0 does not wait forever for its peer: torchrun stops it
        assert not ranks["0"].is_running()
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    saved = sorted(out.glob("step-*"))
    assert len(saved) >= 2
    for folder in saved:  # published by rank 0's rename after every rank handed over its shards: whole or absent
        assert is_complete_adapter(folder) and (folder / "optimizer.pt").is_file(), folder
        assert adapter(folder)


def test_rlproxy_train_on_two_ranks_trains_publishes_and_stops_cleanly(tiny_model, own_database_url, tmp_path):
    asyncio.run(record_episodes(own_database_url, groups=4, group_size=4))
    port = free_port()
    engine = f"http://127.0.0.1:{port}"
    with running(stub_command(port), engine + "/health", log_path=tmp_path / "stub.log"):
        done = subprocess.run(
            trainer_command(own_database_url, engine, tiny_model, tmp_path / "adapters", "--nproc-per-node", "2",
                            "--max-steps", "2", "--poll-interval", "0.1",
                            settings={**SMALL_STEPS, "batch_rollouts": 8}),
            cwd=ROOT, capture_output=True, text=True, timeout=300)
        served = {m["id"] for m in requests.get(f"{engine}/v1/models").json()["data"]}
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "rank 1: stopped after 2 steps" in output  # the second rank took part in both steps

    state = asyncio.run(snapshot(own_database_url))
    assert state["trained"] == state["stepped"] == 16
    assert [(version, status) for version, status, _ in state["policies"]] == [(1, "retired"), (2, "active")]
    assert all(is_complete_adapter(path) for _, _, path in state["policies"])
    assert state["names"][2] in served  # the active version, under the adapter name its row keeps


def test_a_rank_killed_stops_the_whole_trainer_and_a_restart_trains_every_rollout_once(
        tiny_model, own_database_url, tmp_path):
    import psutil

    asyncio.run(record_episodes(own_database_url, groups=6, group_size=4, calls=3))
    port = free_port()
    engine = f"http://127.0.0.1:{port}"
    command = trainer_command(own_database_url, engine, tiny_model, tmp_path / "adapters", "--nproc-per-node", "2",
                              "--poll-interval", "0.1", settings={**SMALL_STEPS, "ppo_epochs": 10})
    with running(stub_command(port), engine + "/health", log_path=tmp_path / "stub.log"), \
            open(tmp_path / "trainer.log", "ab") as log:
        trainer = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for(own_database_url, lambda s: s["trained"] >= 4)  # both ranks are at work
            [rank_1] = [p for p in psutil.Process(trainer.pid).children(recursive=True)
                        if p.environ().get("RANK") == "1"]
            rank_1.kill()
            assert trainer.wait(timeout=120) != 0  # torchrun stops rank 0 too: nobody waits forever
        finally:
            if trainer.poll() is None:
                os.killpg(trainer.pid, signal.SIGKILL)

        trainer = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            final = wait_for(own_database_url, lambda s: s["trained"] == 24
                             and not any(status == "candidate" for _, status, _ in s["policies"]))
        finally:
            os.killpg(trainer.pid, signal.SIGKILL)
            trainer.wait()
    assert final["stepped"] == final["trained"] == 24  # none trained twice, none lost
    versions = [version for version, _, _ in final["policies"]]
    assert versions == list(range(1, len(versions) + 1))
    assert all(is_complete_adapter(path) for _, _, path in final["policies"])


async def plant_token_past_the_vocabulary(database_url: str, rollout_id: str) -> None:
    """One completion token of one rollout that the model has no embedding for: the rank that takes that
    transition raises (IndexError, as a CUDA OOM on one long transition would raise), the other does not."""
    from sqlalchemy import select, update

    from store.db import open_database, session_factory
    from store.models import Call, CallChoice

    database = open_database(database_url)
    async with session_factory(database)() as session, session.begin():
        [call_id] = (await session.execute(select(Call.id).where(Call.rollout_id == rollout_id))).scalars()
        [tokens] = (await session.execute(select(CallChoice.token_ids).where(CallChoice.call_id == call_id))).scalars()
        await session.execute(update(CallChoice).where(CallChoice.call_id == call_id)
                              .values(token_ids=[TINY_VOCAB + 1000, *tokens[1:]]))
    await database.dispose()


async def rollout_rows(database_url: str, ids: list[str]):
    from sqlalchemy import select

    from store.db import open_database, session_factory
    from store.models import Rollout, TrainStep

    database = open_database(database_url)
    async with session_factory(database)() as session:
        rows = (await session.execute(select(Rollout.trained_at, Rollout.step_attempts, TrainStep.policy_version,
                                             TrainStep.metrics).outerjoin(TrainStep)
                                      .where(Rollout.id.in_(ids)))).all()
    await database.dispose()
    return rows


def test_a_batch_that_fails_on_one_rank_is_set_aside_by_every_rank_and_training_goes_on(
        tiny_model, own_database_url, tmp_path):
    """It used to stop a multi-rank trainer for good: the step's exception was re-raised, and every restart
    claimed the same rollouts again. Now each step is counted on its rollouts before it runs; every rank stops,
    the chart starts them again (here the test does), and after two unfinished tries the batch is set aside and
    never claimed again."""
    poison = asyncio.run(record_episodes(own_database_url, groups=1, group_size=2, calls=1, task_prefix="poison"))
    asyncio.run(plant_token_past_the_vocabulary(own_database_url, poison[0]))
    healthy = asyncio.run(record_episodes(own_database_url, groups=2, group_size=2, calls=1, task_prefix="healthy"))
    port = free_port()
    engine = f"http://127.0.0.1:{port}"
    command = trainer_command(own_database_url, engine, tiny_model, tmp_path / "adapters", "--nproc-per-node", "2",
                              "--max-steps", "2", "--poll-interval", "0.1",
                              settings={"batch_rollouts": 2, "max_batch_rollouts": 2, "group_size": 2,
                                        "micro_batch_tokens": 256})
    exits = []
    with running(stub_command(port), engine + "/health", log_path=tmp_path / "stub.log"):
        while not exits or exits[-1] != 0 and len(exits) < 4:  # restarted as the chart restarts a failed pod
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"})
            exits.append(done.returncode)
            output = done.stdout + done.stderr
    assert len(exits) == 3 and exits[0] != 0 and exits[1] != 0 and exits[2] == 0, (exits, output[-4000:])
    assert "set aside as step_failed" in output and "rank 1: stopped after 2 steps" in output
    # third start: the batch whose steps failed twice is set aside, and both ranks train both healthy batches

    set_aside = asyncio.run(rollout_rows(own_database_url, poison))
    assert all(trained is not None and attempts == 2 and version is None and metrics["failed"]
               and metrics["skipped"] == {"step_failed": 2} for trained, attempts, version, metrics in set_aside)
    trained = asyncio.run(rollout_rows(own_database_url, healthy))
    assert sorted(version for _, _, version, _ in trained) == [1, 1, 2, 2]  # each once, after the poisoned one
