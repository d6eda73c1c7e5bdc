"""Which adapter folders the trainer keeps, and room for the next one.

Every step writes a version folder (fp32 LoRA weights, and AdamW's two moments in optimizer.pt: about 370 MB at
r=32 on an 8B model); kept forever they filled the adapters volume within hours, and then every save raised and
the trainer exited at every restart. After each step's publish (and at start) the trainer keeps, for each named
policy:

* the active version, and its parent (what a rollback goes back to);
* candidates and canaries (a gate may still make them serve);
* the version each policy trains on from (normally the active one);
* the newest `keep_versions` versions.

Other folders are removed once no engine holds their adapter any more (the drain unloaded it: a replica that
restarts reloads a serving version from its folder, never one that stopped serving), and their rows say so
(`weights_kept`, shown by `GET /policies`; activating one is refused with a 409). Only folders inside
`adapters_dir` are ever removed: a version recorded with a folder elsewhere is the operator's.

Optimizer state is what resuming needs and nothing else reads: it stays only in the versions training may go on
from (the one it trains on, candidates, the newest of each policy), and so do the float32 master weights beside
a bf16 served copy (trainer/adapter.py). A rollback to an older version trains on with fresh AdamW moments, from
the weights it served.

Before each save, `room_for_save` compares the free space with what the next version takes (the newest folder's
size, or an estimate from the adapter's parameters): short of it, the step is not saved or published, an ALERT
is logged and counted, and the rollouts wait for space (never a crash loop).
"""
from __future__ import annotations

import logging
import shutil
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from core.errors import RlproxyError
from engine.lifecycle import Drain
from store import policies
from store.models import Policy, PolicyStatus
from trainer.adapter import MASTER_WEIGHTS, OPTIMIZER_STATE

log = logging.getLogger("rlproxy.trainer")

HEADROOM = 2.0  # free space wanted before a save, in sizes of one version: that one, and the margin of another
# Before a version exists to measure: fp32 weights, AdamW's two fp32 moments, and on GPUs a bf16 served copy.
ESTIMATE_BYTES_PER_PARAMETER = 14


class NoRoomForAdapter(RlproxyError):
    """Too little free space in adapters_dir for the next version: the step is neither saved nor published."""


class AdapterRetention:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], adapters_dir: Path, keep_versions: int,
                 drain: Drain) -> None:
        self.sessions = sessions
        self.adapters_dir = Path(adapters_dir).resolve()
        self.keep_versions = keep_versions
        self.drain = drain
        self.newest_bytes = 0  # the size of the newest version folder seen (what the next save takes)

    async def sweep(self, trains_from: Mapping[str, int]) -> list[int]:
        """Remove the folders (and optimizer states) nothing needs any more, by the rules above. `trains_from`:
        the version each policy this trainer trains goes on from. Returns the versions whose folders went."""
        async with self.sessions() as session:
            rows = await policies.with_weights(session)
        keep, resume = _needed(rows, trains_from, self.keep_versions)
        removed = []
        for row in rows:
            folder = Path(row.path).resolve() if row.path else None
            if row.version in keep:
                if folder is not None and row.version not in resume and self._ours(folder):
                    for resume_only in (OPTIMIZER_STATE, MASTER_WEIGHTS):  # goes on from the served copy
                        (folder / resume_only).unlink(missing_ok=True)
                continue
            if self.drain.draining(row.name) or (folder is not None and not self._ours(folder)):
                continue  # an engine may still load it; or a folder this trainer did not write
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
                if folder.exists():
                    log.warning("could not remove %s (v%d): tried again after the next step", folder, row.version)
                    continue
            removed.append(row.version)
        if removed:
            async with self.sessions() as session, session.begin():
                await policies.mark_weights_removed(session, removed)
            log.info("removed the adapter folders of %s: no longer serving, a rollback target, under evaluation "
                     "or among the newest %d (keep_versions)", ", ".join(f"v{v}" for v in removed),
                     self.keep_versions)
        newest = max((r.version for r in rows if r.version in keep and r.path and Path(r.path).is_dir()),
                     default=None)
        if newest is not None:  # the only one with optimizer state for sure: what a save writes
            self.newest_bytes = folder_bytes(Path(next(r.path for r in rows if r.version == newest)))
        return removed

    def room_for_save(self, policy, metrics) -> bool:
        """Whether the adapters volume has room for the next version of `policy` (a PolicyTrainer; its LoRA
        parameters make the estimate until a version was measured); if not, an ALERT, counted in `metrics`."""
        estimate = sum(p.numel() for p in policy.params) * ESTIMATE_BYTES_PER_PARAMETER if policy is not None else 0
        wanted = int(HEADROOM * (self.newest_bytes or estimate))
        self.adapters_dir.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.adapters_dir).free
        if free >= wanted:
            return True
        metrics.saves_skipped.inc()
        log.error("ALERT: %s has %.1f MB free and the next adapter version wants %.1f MB: no step is saved or "
                  "published until there is room (lower keep_versions, or give the volume more space); the "
                  "rollouts wait", self.adapters_dir, free / 1e6, wanted / 1e6)
        return False

    def _ours(self, folder: Path) -> bool:
        return folder.is_relative_to(self.adapters_dir) and folder != self.adapters_dir


def _needed(rows: list[Policy], trains_from: Mapping[str, int], keep_versions: int) -> tuple[set[int], set[int]]:
    """(versions whose folders stay, versions whose optimizer state stays)."""
    by_policy: dict[str, list[Policy]] = defaultdict(list)
    for row in rows:
        by_policy[row.policy].append(row)
    keep: set[int] = set(trains_from.values())
    resume: set[int] = set(trains_from.values())
    for line in by_policy.values():
        newest = sorted(row.version for row in line)[-keep_versions:]
        keep.update(newest)
        resume.add(newest[-1])
        for row in line:
            if row.status == PolicyStatus.ACTIVE:
                keep.add(row.version)
                if row.parent_version is not None:
                    keep.add(row.parent_version)
            elif row.status in policies.UNDER_EVALUATION:
                keep.add(row.version)
                resume.add(row.version)
    return keep, resume


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.iterdir() if path.is_file())
