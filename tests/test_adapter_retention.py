"""Adapter retention: the trainer keeps the folders serving and rollback need (each policy's active version, its
parent, candidates) and the newest `keep_versions`, optimizer state only where it resumes from, and says which
versions lost their weights; too little disk space skips a save with an ALERT instead of crashing. Real Postgres,
the stub engine (which loads adapters like vLLM) and the proxy process."""
from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path

import pytest
import requests
from sqlalchemy import select

from core.settings import TrainerSettings, TrainingSettings
from store.models import Policy, Rollout
from tests.support import running_proxy
from tests.episodes import record_episodes

pytest.importorskip("torch")
pytestmark = pytest.mark.train

KEEP = 3
SMALL = TrainingSettings(batch_rollouts=2, max_batch_rollouts=2, group_size=2, micro_batch_tokens=256,
                         max_staleness=100)  # every batch trains: recorded before the first version


def trainer_settings(database_url: str, engine: str, adapters: Path) -> TrainerSettings:
    return TrainerSettings(database_url=database_url, upstreams=(engine,), adapters_dir=adapters, metrics_port=None,
                           worker_id="test-trainer", drain_seconds=0, keep_versions=KEEP, training=SMALL)


async def train_steps(settings: TrainerSettings, model: Path, steps: int):
    from trainer.worker import TrainerWorker

    worker = TrainerWorker(settings, model)
    await worker.start()
    try:
        for _ in range(steps):
            assert await worker.step_once()
        async with worker.sessions() as session:
            rows = (await session.execute(select(Policy).order_by(Policy.version))).scalars().all()
        return worker, rows
    finally:
        await worker.database.dispose()


def test_twenty_versions_leave_at_most_keep_plus_three_folders_and_rollback_and_resume_still_work(
        tiny_model, own_database_url, stub_url, tmp_path):
    from trainer.worker import TrainerWorker

    asyncio.run(record_episodes(own_database_url, groups=20, group_size=2, calls=1))
    adapters = tmp_path / "adapters"
    settings = trainer_settings(own_database_url, stub_url, adapters)
    worker, rows = asyncio.run(train_steps(settings, tiny_model, 20))

    assert [row.version for row in rows] == list(range(1, 21))
    folders = sorted(path.name for path in adapters.iterdir() if path.is_dir())
    assert len(folders) <= KEEP + 3, folders
    kept = {row.version for row in rows if row.weights_kept}
    assert kept == {18, 19, 20}  # the newest KEEP (the active v20 and its parent v19 among them)
    assert sorted(f"v{version}" for version in kept) == folders  # the store says which folders are there
    assert worker.metrics.adapters_removed._value.get() == 17
    with_optimizer = [path.name for path in adapters.glob("*/optimizer.pt")]
    assert with_optimizer == ["optimizer.pt"] and (adapters / "v20" / "optimizer.pt").is_file()

    async def restarted():  # resumes from the newest version, with its optimizer state
        again = TrainerWorker(settings, tiny_model)
        await again.start()
        try:
            line = again.lines["default"]
            return line.parent_version, again.policy.step_count
        finally:
            await again.database.dispose()

    assert asyncio.run(restarted()) == (20, 20)

    with running_proxy([stub_url], own_database_url, tmp_path) as proxy:
        listed = {row["version"]: row["weights_kept"] for row in requests.get(f"{proxy}/policies").json()["data"]}
        assert listed[0] and listed[20] and listed[19] and not listed[3]
        gone = requests.post(f"{proxy}/policies/3/activate")
        assert gone.status_code == 409, gone.text
        assert "adapter folder was removed" in gone.json()["error"]["message"]
        assert requests.get(f"{proxy}/policies").json()["active"] == 20  # nothing changed
        rollback = requests.post(f"{proxy}/policies/19/activate")  # the parent: the rollback target
        assert rollback.status_code == 200, rollback.text
        assert requests.get(f"{proxy}/policies").json()["active"] == 19


def test_too_little_disk_space_skips_the_save_with_an_alert_and_the_rollouts_wait(
        tiny_model, own_database_url, stub_url, tmp_path, monkeypatch, caplog):
    from trainer import retention
    from trainer.worker import TrainerWorker

    ids = asyncio.run(record_episodes(own_database_url, groups=1, group_size=2, calls=1))
    settings = trainer_settings(own_database_url, stub_url, tmp_path / "adapters")
    real_usage, looks = shutil.disk_usage, []

    def usage(path):  # room before the claim, none when the step is about to be saved
        looks.append(path)
        return real_usage(path)._replace(free=10**12 if len(looks) == 1 else 1000)

    monkeypatch.setattr(retention.shutil, "disk_usage", usage)

    async def run():
        worker = TrainerWorker(settings, tiny_model)
        await worker.start()
        try:
            outcomes = [await worker.step_once(), await worker.step_once()]
            async with worker.sessions() as session:
                rows = (await session.execute(select(Rollout.trained_at, Rollout.lease_owner)
                                              .where(Rollout.id.in_(ids)))).all()
                versions = (await session.execute(select(Policy.version))).scalars().all()
            return worker, outcomes, rows, versions
        finally:
            await worker.database.dispose()

    with caplog.at_level(logging.ERROR, logger="rlproxy.trainer"):
        worker, outcomes, rows, versions = asyncio.run(run())
    assert outcomes == [False, False]  # no crash: the first step computed and was not saved, the second not begun
    assert versions == [] and not any((tmp_path / "adapters").iterdir())
    assert all(trained is None and owner is None for trained, owner in rows)  # released: trained when there is room
    assert worker.metrics.saves_skipped._value.get() == 2
    assert sum("ALERT" in record.message and "MB free" in record.message for record in caplog.records) == 2
