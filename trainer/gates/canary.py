"""The canary gates: a candidate answers a share of new rollouts (`canary`: all of them; `eval-traffic`:
evaluation rollouts only, see store/canary.py) until the judge promotes or retires it on their rewards against
the active policy's over the same period.

The canary is judged here, in the worker's loop, rather than by a separate command: the trainer is what waits
on the verdict anyway (its next step trains from whichever version wins), and it resumes judging a canary it
left running when it restarts. Training pauses while a canary runs, so no version is built on an unproven one.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from core.promotion import promotes
from core.settings import TrainerSettings
from engine import lifecycle
from engine.adapters import EngineAdapters
from store import canary as canaries
from store import policies, training
from store.db import short_session
from store.models import PolicyStatus

log = logging.getLogger("rlproxy.gates")


@dataclass(slots=True, frozen=True)
class Verdict:
    version: int
    promoted: bool
    canary: canaries.Arm
    active: canaries.Arm


async def judge(session, *, min_rollouts: int, margin: float,
                policy: str = policies.DEFAULT_POLICY) -> Verdict | None:
    """Decide `policy`'s running canary once both it and that policy's active version have answered
    `min_rollouts` finished rollouts since it started, and end it (promoted or retired). None while there is
    no canary or not enough evidence."""
    canary = await canaries.running(session, policy)
    if canary is None:
        return None
    active = await policies.active_policy(session, policy)
    arms = await canaries.evidence(session, canary, (canary.version, active.version))
    mine, theirs = arms[canary.version], arms[active.version]
    if mine.rollouts < min_rollouts or theirs.rollouts < min_rollouts:
        return None
    promoted = promotes(mine.mean_reward, theirs.mean_reward, margin)
    await canaries.end(session, canary, promoted, mine=mine, theirs=theirs, margin=margin)
    return Verdict(canary.version, promoted, mine, theirs)


class CanaryGate:
    """`canary` or `eval-traffic` (settings.gate). With `settings.training.eval_agents`, the rollouts of those
    agents count as evaluation traffic: the proxies route them by name, and the judge marks them before it
    counts."""

    def __init__(self, settings: TrainerSettings, stop: asyncio.Event | None = None, metrics=None) -> None:
        self.settings = settings
        self.metrics = metrics  # trainer.metrics.TrainerMetrics: evaluation rewards of the rollouts marked here
        self.stop = stop or asyncio.Event()
        self.eval_agents = tuple(settings.training.eval_agents)
        self.traffic = canaries.EVAL if settings.gate == "eval-traffic" else canaries.ALL
        self.fraction = settings.eval_fraction if self.traffic == canaries.EVAL else settings.canary_fraction

    async def __call__(self, version: int) -> bool | None:
        s = self.settings
        what = "evaluation rollouts" if self.traffic == canaries.EVAL else "rollouts"
        async with short_session(s.database_url) as sessions:
            key = s.upstream_api_key
            adapters = EngineAdapters(s.upstreams, api_key=key.get_secret_value() if key else None)
            started = await lifecycle.start_canary(sessions, adapters, version, self.fraction, traffic=self.traffic,
                                                   eval_agents=self.eval_agents)
            log.info("v%d in canary for %.0f%% of new %s since %s; judged after %d rollouts each",
                     version, 100 * started.fraction, what, started.started_at.isoformat(timespec="seconds"),
                     s.canary_min_rollouts)
            async with sessions() as session:
                policy = await policies.policy_of(session, version)
            while not self.stop.is_set():
                async with sessions() as session, session.begin():
                    # training waits while this runs, so the worker's own marking of eval agents does too
                    marked = await training.mark_eval_agents(session, self.eval_agents)
                for marked_version, reward in marked if self.metrics is not None else ():
                    self.metrics.observe_eval(marked_version, reward)
                async with sessions() as session, session.begin():
                    verdict = await judge(session, min_rollouts=s.canary_min_rollouts, margin=s.gate_margin,
                                          policy=policy)
                    status = (await policies.get_policy(session, version)).status
                if verdict is not None and verdict.version == version:
                    log.info("canary v%d: mean reward %.3f over %d %s vs v%d %.3f over %d -> %s", version,
                             verdict.canary.mean_reward, verdict.canary.rollouts, what, verdict.active.version,
                             verdict.active.mean_reward, verdict.active.rollouts,
                             "promoted" if verdict.promoted else "retired")
                    return verdict.promoted
                if status != PolicyStatus.CANARY:  # ended by hand, e.g. POST /policies/{version}/activate
                    return status == PolicyStatus.ACTIVE
                try:
                    await asyncio.wait_for(self.stop.wait(), s.poll_interval)
                except asyncio.TimeoutError:
                    pass
            return None  # stopped: the canary keeps running and is judged when the trainer is back
