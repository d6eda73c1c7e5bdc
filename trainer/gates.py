"""What a trained, loaded candidate must pass before it serves (`TrainerSettings.gate`), as the worker's
`on_published` hook: True promotes it, False retires it and training continues from the policy that serves,
None leaves it undecided for the next run.

    none     no hook: the worker activates every new version at once
    heldout  its success on the demo task family's held-out split, measured on the engine directly, is not
             worse than its parent's by more than `gate_margin` (demo/evaluate.py)
    canary   it answers `canary_fraction` of new rollouts; the judge promotes it once it has answered
             `canary_min_rollouts` finished rollouts whose mean reward is not worse than the active policy's
             over the same period by more than `gate_margin`, else retires it (store/canary.py routes)

The canary is judged here, in the worker's loop, rather than by a separate command: the trainer is what waits
on the verdict anyway (its next step trains from whichever version wins), and it resumes judging a canary it
left running when it restarts. Training pauses while a canary runs, so no version is built on an unproven one.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from rlproxy.settings import TrainerSettings
from store import canary as canaries
from store import policies
from store.db import create_engine, session_factory
from store.models import PolicyStatus

log = logging.getLogger("rlproxy.gates")


def build_gate(settings: TrainerSettings):
    """The worker's `on_published` hook for `settings.gate` (None for "none")."""
    if settings.gate == "heldout":
        return HeldoutGate(settings)
    if settings.gate == "canary":
        return CanaryGate(settings)
    return None


class HeldoutGate:
    def __init__(self, settings: TrainerSettings, seed: int = 0) -> None:
        if not settings.upstreams:
            raise ValueError("the held-out gate needs an engine (--upstream) to evaluate on")
        self.settings = settings
        self.seed = seed

    async def __call__(self, version: int) -> bool:
        from demo import evaluate
        from demo.tasks import heldout_tasks

        engine_url = self.settings.upstreams[0].rstrip("/")
        key = self.settings.upstream_api_key.get_secret_value() if self.settings.upstream_api_key else None
        engine_key = key or "unused"  # the openai client insists on some key
        tasks = heldout_tasks(self.settings.heldout_tasks, seed=self.seed)
        digest = evaluate.task_set(tasks)
        async with evaluate.transaction(self.settings.database_url) as session:
            candidate = await policies.get_policy(session, version)
            parent = candidate.parent_version or policies.BASE_VERSION
            parent_success = await evaluate.known_success(session, parent, digest)
            parent_row = None if parent == policies.BASE_VERSION else await policies.get_policy(session, parent)
        if parent_success is None:
            if parent_row is not None:
                await evaluate.ensure_loaded(engine_url, parent_row.name, parent_row.path, key)
            model = parent_row.name if parent_row is not None else await evaluate.base_model(engine_url, key)
            log.info("measuring parent v%d on %d held-out tasks", parent, len(tasks))
            measured = await evaluate.evaluate_heldout(f"{engine_url}/v1", model, tasks, api_key=engine_key)
            parent_success = measured.success
            async with evaluate.transaction(self.settings.database_url) as session:
                await evaluate.record(session, parent, measured)
        log.info("measuring candidate v%d on %d held-out tasks", version, len(tasks))
        result = await evaluate.evaluate_heldout(f"{engine_url}/v1", policies.adapter_name(version), tasks,
                                                 api_key=engine_key)
        promoted = evaluate.passes(result.success, parent_success, self.settings.gate_margin)
        async with evaluate.transaction(self.settings.database_url) as session:
            await evaluate.record(session, version, result, parent=parent, parent_heldout_success=parent_success,
                                  margin=self.settings.gate_margin, promoted=promoted)
        log.info("v%d held-out %s vs v%d %.1f%% -> %s", version, result.describe(), parent, 100 * parent_success,
                 "promoted" if promoted else "retired")
        return promoted


@dataclass(slots=True, frozen=True)
class Verdict:
    version: int
    promoted: bool
    canary: canaries.Arm
    active: canaries.Arm


async def judge(session, *, min_rollouts: int, margin: float) -> Verdict | None:
    """Decide the running canary once both it and the active policy have answered `min_rollouts` finished
    rollouts since it started, and end it (promoted or retired). None while there is no canary or not
    enough evidence."""
    canary = await canaries.running(session)
    if canary is None:
        return None
    active = await policies.active_policy(session)
    arms = await canaries.evidence(session, canary, (canary.version, active.version))
    mine, theirs = arms[canary.version], arms[active.version]
    if mine.rollouts < min_rollouts or theirs.rollouts < min_rollouts:
        return None
    promoted = mine.mean_reward >= theirs.mean_reward - margin
    await canaries.end(session, canary, promoted, {
        "rollouts": mine.rollouts, "mean_reward": mine.mean_reward, "active_version": active.version,
        "active_rollouts": theirs.rollouts, "active_mean_reward": theirs.mean_reward, "margin": margin})
    return Verdict(canary.version, promoted, mine, theirs)


class CanaryGate:
    def __init__(self, settings: TrainerSettings, stop: asyncio.Event | None = None) -> None:
        self.settings = settings
        self.stop = stop or asyncio.Event()

    async def __call__(self, version: int) -> bool | None:
        s = self.settings
        engine = create_engine(s.database_url, pool_size=1)
        sessions = session_factory(engine)
        try:
            async with sessions() as session, session.begin():
                started = await canaries.start(session, version, s.canary_fraction)
            log.info("v%d in canary for %.0f%% of new rollouts since %s; judged after %d rollouts each",
                     version, 100 * started.fraction, started.started_at.isoformat(timespec="seconds"),
                     s.canary_min_rollouts)
            while not self.stop.is_set():
                async with sessions() as session, session.begin():
                    verdict = await judge(session, min_rollouts=s.canary_min_rollouts, margin=s.gate_margin)
                    status = (await policies.get_policy(session, version)).status
                if verdict is not None and verdict.version == version:
                    log.info("canary v%d: mean reward %.3f over %d rollouts vs v%d %.3f over %d -> %s", version,
                             verdict.canary.mean_reward, verdict.canary.rollouts, verdict.active.version,
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
        finally:
            await engine.dispose()
