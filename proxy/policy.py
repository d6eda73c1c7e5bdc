"""Which policy answers: the served model name routes to the active adapter (or the base model) — or, while a
canary runs, to the canary for the fixed fraction of rollouts its hash picks (store/canary.py). Both are read
from the store every `policy_refresh_interval`, so every proxy sharing the database follows activations and
agrees on which rollouts the canary answers.

An evaluation-traffic canary answers evaluation rollouts only. A call says it is one by header or agent name;
a rollout created with `POST /rollouts {"eval": true}` (or for an evaluation agent) is looked up in the store
once (then remembered), and only while such a canary runs and would answer that rollout: other calls pay
nothing for it."""
from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from proxy.context import CallContext
from store import canary as canaries
from store.models import Rollout
from store.policies import BASE, ActivePolicy

ROLLOUT_CACHE_SIZE = 65_536  # rollouts whose evaluation flag and agent are remembered (a few MB)

log = logging.getLogger("rlproxy.policy")


@dataclass(slots=True, frozen=True)
class Route:
    upstream_model: str
    policy_version: int | None  # None: a model outside the policy (e.g. an explicit adapter or other model)


class PolicyRouter:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], served_model: str | None) -> None:
        self.sessions = sessions
        self.served_model = served_model
        self.base_model: str | None = None
        self.active: ActivePolicy = BASE
        self.canary: canaries.Canary | None = None
        self._task: asyncio.Task | None = None
        self._kinds: OrderedDict[str, tuple[bool, str | None]] = OrderedDict()  # id -> (eval, agent)

    def policy_for(self, rollout_id: str | None, evaluation: bool = False) -> ActivePolicy:
        """The policy that answers the served model for this rollout; a call without a rollout gets the
        active one (the canary is judged by rollouts, so it only takes calls it can be judged by)."""
        canary = self.canary
        if canary is not None and rollout_id is not None and canary.answers(rollout_id, evaluation):
            return ActivePolicy(canary.version, canary.name)
        return self.active

    def version_for(self, rollout_id: str | None, evaluation: bool = False) -> int:
        return self.policy_for(rollout_id, evaluation).version

    def version_for_new(self, rollout_id: str, evaluation: bool, agent: str | None) -> int:
        """The version that will answer a rollout created now (POST /rollouts); remembers what it is."""
        self.remember_rollout(rollout_id, evaluation, agent)
        canary = self.canary
        by_agent = canary is not None and canary.traffic == canaries.EVAL and agent in canary.eval_agents
        return self.version_for(rollout_id, evaluation or by_agent)

    async def route_call(self, requested_model: str, context: CallContext) -> Route:
        """`route` for a call, knowing whether its rollout is evaluation traffic when that decides it."""
        evaluation = context.eval
        canary = self.canary
        if (not evaluation and canary is not None and canary.traffic == canaries.EVAL
                and context.rollout_id is not None and requested_model == self.served_model
                and canaries.serves(canary, context.rollout_id)):
            if context.agent in canary.eval_agents:
                evaluation = True
            else:
                created_eval, agent = await self._rollout_kind(context.rollout_id)
                evaluation = created_eval or agent in canary.eval_agents
        return self.route(requested_model, context.rollout_id, evaluation)

    def remember_rollout(self, rollout_id: str, evaluation: bool, agent: str | None) -> None:
        self._kinds[rollout_id] = (evaluation, agent)
        if len(self._kinds) > ROLLOUT_CACHE_SIZE:
            self._kinds.popitem(last=False)

    async def _rollout_kind(self, rollout_id: str) -> tuple[bool, str | None]:
        """(created as evaluation, agent) of a rollout, from the store once."""
        known = self._kinds.get(rollout_id)
        if known is None:
            # POST /rollouts commits before it answers, so a rollout created there is found here; one not
            # found is created by its first call, as training traffic unless the call says otherwise.
            async with self.sessions() as session:
                row = (await session.execute(
                    select(Rollout.eval, Rollout.agent).where(Rollout.id == rollout_id))).first()
            known = (bool(row[0]), row[1]) if row is not None else (False, None)
            self.remember_rollout(rollout_id, *known)
        return known

    def route(self, requested_model: str, rollout_id: str | None = None, evaluation: bool = False) -> Route:
        if requested_model != self.served_model:
            return Route(requested_model, None)
        policy = self.policy_for(rollout_id, evaluation)
        if policy.name is not None:
            return Route(policy.name, policy.version)
        return Route(self.base_model or requested_model, policy.version)

    async def refresh(self) -> None:
        async with self.sessions() as session:
            active, canary = await canaries.serving(session)
        if active != self.active:
            log.info("now serving policy version %d (%s)", active.version, active.name or "base model")
        if canary != self.canary:
            if canary is not None:
                log.info("canary: policy version %d answers %.0f%% of new %s", canary.version,
                         100 * canary.fraction,
                         "evaluation rollouts" if canary.traffic == canaries.EVAL else "rollouts")
            else:
                log.info("canary of policy version %d ended", self.canary.version)
        self.active, self.canary = active, canary

    async def start(self, interval: float) -> None:
        await self.refresh()
        self._task = asyncio.create_task(self._loop(interval), name="policy-refresh")

    async def _loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.refresh()
            except Exception as exc:  # noqa: BLE001 — keep serving the last known policy
                log.warning("could not read the active policy: %s", exc)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
