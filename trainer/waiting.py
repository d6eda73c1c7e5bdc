"""The yield of the traffic already waiting when `rlproxy train` starts: what its first steps would make of it.

    await log_waiting_yield(sessions, settings, {"default": 3})   # policy -> the version it trains from

A team that pointed an agent at the proxy for a week learns at once, before any step, whether that traffic can be
trained: the waiting rollouts (whole task groups, up to `MOST` rollouts, oldest first, unleased) are decided as a
step would decide them (trainer/batch.py build_transitions: too long, sampled otherwise than the trainer can
rebuild, greedy, stale, zero advantage, ...) and one line per policy says how many of its calls would be trained
and why the rest would not. Nothing is leased, trained or stored: the steps decide again when they take them.
"""
from __future__ import annotations

import logging
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from core.settings import TrainerSettings
from store import policies, training
from store.models import utcnow
from trainer.batch import build_transitions
from trainer.staleness import Staleness
from trainer.transitions import SkipReasons
from trainer.yields import call_yield

log = logging.getLogger("rlproxy.trainer")

MOST = 512  # rollouts looked at: enough to say what the traffic is, few enough to read at every start


async def waiting_yield(sessions: async_sessionmaker[AsyncSession], settings: TrainerSettings,
                        parents: dict[str, int]) -> tuple[int, dict[str, dict[str, Any]]]:
    """(rollouts looked at, policy -> its yield over them: trainer/yields.py call_yield's report)."""
    wanted = settings.training
    async with sessions() as session:
        ids = await training.ready_rollouts(session, limit=MOST, most=MOST, group_size=wanted.group_size,
                                            group_timeout_s=0.0, agents=wanted.train_agents)
        if not ids:
            return 0, {}
        rollouts = await training.load_rollouts(session, ids)
        lineages = {name: await policies.lineage(session, name) for name in parents}
    reports = {}
    for policy, version in parents.items():
        skips = SkipReasons()
        build_transitions(rollouts, wanted, version, skips, policy=policy, lineage=lineages[policy],
                          staleness=Staleness(now=utcnow()))
        reports[policy] = call_yield(rollouts, policy, skips.decisions)
    return len(rollouts), reports


async def log_waiting_yield(sessions: async_sessionmaker[AsyncSession], settings: TrainerSettings,
                            parents: dict[str, int]) -> dict[str, dict[str, Any]]:
    """The waiting traffic's yield as one log line per policy that answered any of it (or one saying none waits)."""
    looked, reports = await waiting_yield(sessions, settings, parents)
    if not looked:
        log.info("no rewarded rollouts are waiting to be trained")
        return {}
    for policy, report in reports.items():
        if report["calls_seen"]:
            skipped = ", ".join(f"{reason} {n}" for reason, n in
                                sorted(report["calls_skipped"].items(), key=lambda item: (-item[1], item[0])))
            log.info("waiting traffic, policy %r: %d of the %d calls it answered in %s%d rewarded rollouts would be "
                     "trained%s", policy, report["calls_trained"], report["calls_seen"],
                     "the oldest " if looked >= MOST else "", looked, f"; not trained: {skipped}" if skipped else "")
    return reports
