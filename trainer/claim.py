"""Which rewarded rollouts a step takes: evaluation traffic marked first (never claimed), then whole groups of
the waiting rollouts (store/training.py ready_rollouts), leased to this trainer's run."""
from __future__ import annotations

import logging

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from core.settings import TrainerSettings
from store import training
from trainer.metrics import TrainerMetrics

log = logging.getLogger("rlproxy.trainer")


async def claim_batch(sessions: async_sessionmaker[AsyncSession], settings: TrainerSettings,
                      metrics: TrainerMetrics, lease_owner: str) -> list[str]:
    """The ids of the rollouts the next step trains, leased to `lease_owner`; [] when none is ready."""
    wanted = settings.training  # which agents' rollouts, in what groups and batches
    if wanted.eval_agents:  # evaluation traffic by agent name: marked, so never claimed below
        async with sessions() as session, session.begin():
            marked = await training.mark_eval_agents(session, wanted.eval_agents)
        for version, reward in marked:
            metrics.observe_eval(version, reward)
        if marked:
            log.info("marked %d rollouts of evaluation agents %s as evaluation traffic", len(marked),
                     ", ".join(wanted.eval_agents))
    async with sessions() as session, session.begin():
        agents = wanted.train_agents
        metrics.rollouts_waiting.set(await training.waiting_rollouts(session, agents))
        # judge+posted: a posted rollout waits for the judge's word, however soon after its reward we look
        judged = settings.reward == "judge+posted"
        ready = await training.ready_rollouts(session, limit=wanted.batch_rollouts, group_size=wanted.group_size,
                                              group_timeout_s=wanted.group_timeout_s,
                                              batch_timeout_s=wanted.batch_timeout_s, agents=agents,
                                              judged=judged, most=wanted.step_rollouts_cap,
                                              settle_s=wanted.settle_s)
        if not ready:
            return []
        return await training.lease(session, ready, lease_owner, settings.lease_seconds, judged=judged)
