"""Data-parallel training (trainer/parallel.py), run as on GPUs but with CPU processes: torchrun starts the
ranks, torch.distributed (gloo here, NCCL on GPUs) sums their gradients."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import pytest
import requests

from tests.support import ROOT, free_port, running, stub_command, trainer_command
from tests.test_trainer_faults import SMALL_STEPS, is_complete_adapter, snapshot, wait_for
from tests.test_trainer_worker import record_episodes

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.train

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]


def test_two_ranks_sharing_each_mini_batch_make_the_same_update_as_one_process(tiny_model, tmp_path):
    from safetensors.torch import load_file

    alone, shared = tmp_path / "alone", tmp_path / "two-ranks"
    subprocess.run([sys.executable, "tests/parallel_step.py", str(tiny_model), str(alone)], cwd=ROOT, check=True)
    subprocess.run([*TORCHRUN, "--nproc-per-node", "2", "tests/parallel_step.py", str(tiny_model), str(shared)],
                   cwd=ROOT, check=True)

    one, two = (load_file(str(folder / "adapter_model.safetensors")) for folder in (alone, shared))
    assert one.keys() == two.keys()
    assert max(float(t.abs().max()) for name, t in one.items() if "lora_B" in name) > 1e-3  # it did learn
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=1e-6, msg=name)

    one_metrics, two_metrics = (json.loads((folder / "metrics.json").read_text()) for folder in (alone, shared))
    assert two_metrics["trained_tokens"] == one_metrics["trained_tokens"]
    assert two_metrics["tokens"] == one_metrics["tokens"]  # every transition computed once, by one of the ranks
    assert two_metrics["updates"] == one_metrics["updates"] == 4  # 2 epochs x 2 mini-batches
    for name in ("loss", "policy_loss", "kl", "clip_fraction", "entropy"):
        assert two_metrics[name] == pytest.approx(one_metrics[name], rel=1e-4, abs=1e-7), name


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
    assert "rlproxy-v2" in served


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
