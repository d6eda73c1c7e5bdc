"""Which policy answers: the routing rules (core/policy_rules.py) pick a named policy for the call's agent
and project; the served model name then routes to that policy's active adapter (or the base model) — or, while
a canary of that policy runs, to the canary for the fixed fraction of rollouts its hash picks
(store/canary.py). Both are read from the store every `policy_refresh_interval`, so every proxy sharing the
database follows activations and agrees on which rollouts the canary answers. The same look reads which
replicas are out of rotation for each serving version (engine/fleet.py) and hands them to the replica pool.

An evaluation-traffic canary answers evaluation rollouts only. A call says it is one by header or agent name;
a rollout created with `POST /rollouts {"eval": true}` (or for an evaluation agent) is looked up in the store
once (then remembered), and only while such a canary runs and would answer that rollout: other calls pay
nothing for it.

An activation (`POST /policies/{version}/activate`, `activate`) is made here too: the route only reads the request,
and the router follows the new version at once rather than at its next refresh."""
from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from core.policy_rules import BASE_POLICY, PolicyRules
from engine import lifecycle
from engine.adapters import AdapterError
from proxy.context import CallContext
from proxy.errors import InvalidRequest, NotFoundError, UpstreamUnavailable
from proxy.metrics import ProxyMetrics
from proxy.policy.pins import RolloutPins
from proxy.upstream import UpstreamPool
from store import canary as canaries
from store import errors as store_errors
from store import policies as store_policies
from store import replicas
from store.rollouts import rollout_kind
from store.policies import ActivePolicy, base_of

# The model name that means "whatever policy serves this rollout" (what Agent Lightning agents ask for), as the
# served model name does.
AUTO_MODEL = "auto"
ROLLOUT_CACHE_SIZE = 65_536  # rollouts whose evaluation flag and agent are remembered (a few MB)

log = logging.getLogger("rlproxy.policy")


@dataclass(slots=True, frozen=True)
class Route:
    upstream_model: str
    policy_version: int | None  # None: a model outside the policy (e.g. an explicit adapter or other model)
    policy: str | None = None  # the named policy that answers; None with policy_version


class PolicyRouter:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], served_model: str | None,
                 rules: PolicyRules | None = None, upstreams: UpstreamPool | None = None) -> None:
        self.sessions = sessions
        self.served_model = served_model
        self.rules = rules or PolicyRules()
        self.upstreams = upstreams  # told which replicas are out of rotation for what serves
        self.pins = RolloutPins(self.rules.version_hold)  # a running rollout's version (proxy/policy/pins.py)
        self.base_model: str | None = None
        self.lines: dict[str, canaries.Line] = {}  # named policy -> its active version and canary
        self.withheld: dict[int, dict[str, str]] = {}  # serving version -> {replica out of rotation: why}
        self._task: asyncio.Task | None = None
        self._kinds: OrderedDict[str, tuple[bool, str | None]] = OrderedDict()  # id -> (eval, agent)

    @property
    def active(self) -> ActivePolicy:
        """The default policy's active version (what serves when no routing rule is set)."""
        return self.line(self.rules.default).active

    @property
    def canary(self) -> canaries.Canary | None:
        return self.line(self.rules.default).canary

    def line(self, policy: str) -> canaries.Line:
        return self.lines.get(policy) or canaries.Line(base_of(policy))

    def serving(self) -> list[ActivePolicy | canaries.Canary]:
        """Every version that answers some call now (active and canary, of every policy), adapters only."""
        return [p for line in self.lines.values() for p in (line.active, line.canary)
                if p is not None and p.name is not None]

    def policy_for(self, rollout_id: str | None, evaluation: bool = False, policy: str | None = None) -> ActivePolicy:
        """The version of `policy` (default: the default policy) that answers the served model for this
        rollout; a call without a rollout gets the active one (the canary is judged by rollouts, so it only
        takes calls it can be judged by)."""
        policy = policy or self.rules.default
        line = self.line(policy)
        canary = line.canary
        if canary is not None and rollout_id is not None and canary.answers(rollout_id, evaluation):
            return self.pins.keep(rollout_id, policy, ActivePolicy(canary.version, canary.name, None, canary.policy))
        return self.pins.keep(rollout_id, policy, line.active)

    def version_for(self, rollout_id: str | None, evaluation: bool = False, policy: str | None = None) -> int:
        return self.policy_for(rollout_id, evaluation, policy).version

    def version_for_new(self, rollout_id: str, evaluation: bool, agent: str | None,
                        project: str | None = None) -> int:
        """The version that will answer a rollout created now (POST /rollouts) for its agent; remembers it."""
        self.remember_rollout(rollout_id, evaluation, agent)
        policy = self.rules.choose(agent, project)
        canary = self.line(policy).canary
        by_agent = canary is not None and canary.traffic == canaries.EVAL and agent in canary.eval_agents
        return self.version_for(rollout_id, evaluation or by_agent, policy)

    def serves(self, requested_model: str) -> bool:
        """The model name routes to a policy: the served model name, or "auto"."""
        return requested_model == AUTO_MODEL or requested_model == self.served_model

    async def route_call(self, requested_model: str, context: CallContext) -> Route:
        """`route` for a call: its policy by the rules (a call that names no agent is its rollout's agent's),
        knowing whether its rollout is evaluation traffic when that decides it."""
        if not self.serves(requested_model):
            return Route(requested_model, None)
        agent = context.agent
        if agent is None and context.rollout_id is not None and self.rules.needs_agent:
            agent = (await self._rollout_kind(context.rollout_id))[1]
        policy = self.rules.choose(agent, context.project)
        evaluation = context.eval
        canary = self.line(policy).canary
        if (not evaluation and canary is not None and canary.traffic == canaries.EVAL
                and context.rollout_id is not None and canaries.serves(canary, context.rollout_id)):
            if context.agent in canary.eval_agents:
                evaluation = True
            else:
                created_eval, agent = await self._rollout_kind(context.rollout_id)
                evaluation = created_eval or agent in canary.eval_agents
        return self.route(requested_model, context.rollout_id, evaluation, policy)

    async def rollout_kind(self, rollout_id: str) -> tuple[bool, str | None]:
        """(evaluation, agent) of a rollout as this proxy knows it: created so (`POST /rollouts`), or marked by a
        call's `X-Rlproxy-Eval` (`mark_eval`); read from the store once."""
        return await self._rollout_kind(rollout_id)

    def mark_eval(self, rollout_id: str, agent: str | None) -> None:
        """A call said its rollout is evaluation traffic: so are its later calls that do not say it again."""
        known = self._kinds.get(rollout_id)
        self.remember_rollout(rollout_id, True, known[1] if known is not None else agent)

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
                known = await rollout_kind(session, rollout_id) or (False, None)
            self.remember_rollout(rollout_id, *known)
        return known

    def route(self, requested_model: str, rollout_id: str | None = None, evaluation: bool = False,
              policy: str | None = None) -> Route:
        if not self.serves(requested_model):
            return Route(requested_model, None)
        policy = policy or self.rules.default
        if policy == BASE_POLICY:
            return Route(self._base(requested_model), 0, BASE_POLICY)
        chosen = self.policy_for(rollout_id, evaluation, policy)
        if chosen.name is not None:
            return Route(chosen.name, chosen.version, policy)
        return Route(self._base(requested_model), chosen.version, policy)

    def _base(self, requested_model: str) -> str:
        """The engine's name for the base model ("auto" is not one before the engine is known)."""
        if self.base_model:
            return self.base_model
        return (self.served_model or requested_model) if requested_model == AUTO_MODEL else requested_model

    async def refresh(self) -> None:
        async with self.sessions() as session:
            lines = await canaries.serving_all(session)
            # After the lines: a version's rows are written before it is made to serve, so they are seen.
            versions = {p.version for line in lines.values() for p in (line.active, line.canary)
                        if p is not None and p.name is not None}
            withheld = await replicas.withheld(session, versions)
        for policy in sorted(set(lines) | set(self.lines)):
            old, new = self.line(policy), lines.get(policy) or canaries.Line(base_of(policy))
            if new.active != old.active:
                log.info("policy %r: now serving version %d (%s)", policy, new.active.version,
                         new.active.name or "base model")
            if new.canary != old.canary:
                if new.canary is not None:
                    log.info("policy %r: canary version %d answers %.0f%% of new %s", policy, new.canary.version,
                             100 * new.canary.fraction,
                             "evaluation rollouts" if new.canary.traffic == canaries.EVAL else "rollouts")
                else:
                    log.info("policy %r: canary of version %d ended", policy, old.canary.version)
        self.lines = lines
        self.pins.serving({(name, p.version) for name, line in lines.items() for p in (line.active, line.canary)
                           if p is not None})
        known = {(v, r) for v, urls in self.withheld.items() for r in urls}
        for version, replica in sorted({(v, r) for v, urls in withheld.items() for r in urls} - known):
            log.warning("version %d is not routed to replica %s (out of rotation: %s)", version, replica,
                        withheld[version][replica])
        self.withheld = withheld
        if self.upstreams is not None:
            names = {p.version: p.name for p in self.serving()}
            self.upstreams.withhold({names[v]: frozenset(urls) for v, urls in withheld.items() if v in names})

    async def activate(self, version: int, policy: str, *, named: bool, activatable: set[str] | None,
                       metrics: ProxyMetrics) -> str:
        """`POST /policies/{version}/activate`'s work: serve `version` (0: `policy` back to the base model) and
        follow it at once; returns the policy it belongs to. `named`: the caller named `policy`; `activatable`: the
        policies its key may activate (None: every one). Another project's policy or version answers as one that
        does not exist (404), worded alike, so nothing leaks (docs/security.md)."""
        scoped = activatable is not None
        if not 0 <= version < 2**31:  # versions are 32-bit in the store: anything else cannot exist
            raise _missing_version(version, scoped)
        if version == store_policies.BASE_VERSION and policy == BASE_POLICY:
            raise InvalidRequest(f"{BASE_POLICY!r} is always the base model", param="policy")
        if scoped and (named or version == store_policies.BASE_VERSION) and policy not in activatable:
            raise _hidden_policy(policy)
        if version != store_policies.BASE_VERSION:
            async with self.sessions() as session:
                try:
                    owner = await store_policies.policy_of(session, version)
                except store_errors.NotFound:
                    raise _missing_version(version, scoped) from None
            if scoped and owner not in activatable:
                raise _missing_version(version, scoped)  # before the check below could say whose it is
            if named and owner != policy:
                raise InvalidRequest(f"policy version {version} belongs to policy {owner!r}, not {policy!r}",
                                     param="policy")
            policy = owner
        try:
            # A rollback target is loaded again from its own folder on every replica before it serves, so weights
            # left under its name (another store's, or an older copy) never answer for it.
            await lifecycle.activate(self.sessions, self.upstreams.adapters(), version, policy=policy,
                                     metrics=metrics.fleet)
        except AdapterError as exc:
            raise UpstreamUnavailable(f"policy version {version} was not activated: {exc}") from None
        await self.refresh()
        metrics.observe_policies(self)
        return policy

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


def _hidden_policy(policy: str) -> NotFoundError:
    return NotFoundError(f"policy {policy!r} does not exist or is not this project's", param="policy")


def _missing_version(version: int, scoped: bool) -> NotFoundError:
    """A project's admin key is told the same about another project's version and one that does not exist."""
    if not scoped:
        return NotFoundError(f"policy version {version} does not exist")
    return NotFoundError(f"policy version {version} does not exist or is not this project's", param="version")
