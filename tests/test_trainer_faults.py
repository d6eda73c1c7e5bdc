"""The trainer killed with SIGKILL at arbitrary points (while claiming, stepping, saving or publishing), then
restarted: no rollout is trained twice, none is lost, and no half-written adapter is ever loaded."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

from tests.support import ROOT, free_port, running, stub_command, trainer_command
from tests.episodes import record_episodes
from tests.trainer_support import SMALL_STEPS, is_complete_adapter, snapshot, wait_for

pytest.importorskip("torch")

ROLLOUTS = 24  # six groups of four


def test_sigkill_at_any_point_trains_every_rollout_exactly_once(tiny_model, own_database_url, tmp_path):
    asyncio.run(record_episodes(own_database_url, groups=ROLLOUTS // 4, group_size=4, calls=3))
    port = free_port()
    engine = f"http://127.0.0.1:{port}"
    adapters = tmp_path / "adapters"
    command = trainer_command(own_database_url, engine, tiny_model, adapters, "--poll-interval", "0.1",
                              settings={**SMALL_STEPS, "ppo_epochs": 10, "learning_rate": 1e-3})
    log = open(tmp_path / "trainer.log", "ab")
    with running(stub_command(port), engine + "/health", log_path=tmp_path / "stub.log"):
        # Each run is killed a little later after it claims work, so the kills land in different phases.
        for delay in (0.0, 0.3, 2.0):
            before = asyncio.run(snapshot(own_database_url))
            trainer = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
            try:
                # wait for this run's own first claim (a newer lease) or a step it finished
                wait_for(own_database_url, lambda s: (s["leased"] or 0) != (before["leased"] or 0)
                         or s["trained"] > before["trained"])
                time.sleep(delay)
            finally:
                os.killpg(trainer.pid, signal.SIGKILL)
                trainer.wait()

        trainer = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            final = wait_for(own_database_url, lambda s: s["trained"] == ROLLOUTS
                             and not any(status == "candidate" for _, status, _ in s["policies"]))
        finally:
            trainer.send_signal(signal.SIGINT)
            try:
                trainer.wait(30)
            except subprocess.TimeoutExpired:  # a slow Ctrl-C is not what this test is about
                os.killpg(trainer.pid, signal.SIGKILL)
                trainer.wait()
        served = requests.get(f"{engine}/v1/models").json()["data"]
    log.close()

    # every rollout trained once: the steps' rollout counts add up to exactly the rollouts marked trained
    assert final["stepped"] == final["trained"] == ROLLOUTS
    versions = [version for version, _, _ in final["policies"]]
    assert versions == list(range(1, len(versions) + 1)) and len(versions) >= 2
    # retention removes the folders of versions nothing serves or rolls back to; what it keeps is whole
    kept = [path for _, _, path in final["policies"] if Path(path).exists()]
    assert kept and Path(final["policies"][-1][2]) in map(Path, kept)
    assert all(is_complete_adapter(path) for path in kept)
    statuses = {version: status for version, status, _ in final["policies"]}
    assert statuses[versions[-1]] == "active" and "failed" not in statuses.values()
    adapters_loaded = [m for m in served if m["parent"] is not None]
    # the engine holds loaded weights in memory; every folder of a loaded adapter that is still there is whole
    assert adapters_loaded and all(is_complete_adapter(m["root"]) for m in adapters_loaded if Path(m["root"]).exists())
    assert final["names"][versions[-1]] in {m["id"] for m in adapters_loaded}
