"""A policy version's life, and the one place that decides when its adapter is loaded or unloaded (how is
engine/adapters.py's job; the rows are store/policies.py's and store/canary.py's):

    candidate ──publish──▶ candidate, committed to the fleet ───┬─ start_canary ─▶ canary ─┐
        └─ most replicas did not verify it ─▶ failed             └──── activate ──────────┴─▶ active
    canary, active ──(replaced, judged, rolled back)──▶ retired ──activate (rollback)──▶ active

The rules:
* A version serves (canary or active) only once its adapter is committed to the fleet (engine/fleet.py): loaded
  and verified (the folder's digest, a probe answer) on a strict majority of the replicas. Replicas that could
  not are out of rotation for it, and retried in the background, until they verify.
* A version that does not serve yet is loaded from its own folder with `replace`: whatever a replica holds
  under its name (another store's adapter after a database reset, or this version's older copy) is unloaded
  first, so no other weights can answer for it. Nothing routes to it yet, so the moment between unload and
  load costs nothing.
* A version that serves keeps the copies it has (unloading them would fail its traffic for that moment);
  a replica that lost it (an engine restart) or holds it from another folder gets it loaded again.
* A version that stopped serving is unloaded from every replica `drain_seconds` after it stopped (`Drain`;
  the trainer's setting): the requests it was still answering have had that long to finish, and one that
  takes longer fails when its adapter goes.

Each named policy has its own line of versions (one active, at most one canary); the rules hold per line.

Whoever serves it (the proxy) and whoever trains it (the trainer) both call these rather than write a status
that makes a version serve. (Promoting a canary, store/canary.end, needs no load: it serves already.)
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import fleet
from engine.adapters import AdapterError, EngineAdapters, LoadFailed
from store import canary as canaries
from store import policies
from store.errors import Conflict, NotFound
from store.models import PolicyStatus

log = logging.getLogger("engine.lifecycle")

SERVING = fleet.SERVING


@dataclass(slots=True, frozen=True)
class Version:
    version: int
    name: str
    path: str
    status: str

    @property
    def serving(self) -> bool:
        return self.status in SERVING


async def read(sessions: async_sessionmaker[AsyncSession], version: int) -> Version:
    """A version's adapter name, folder and status; NotFound for one without a row (or without a folder),
    WeightsRemoved (a Conflict) for one whose folder the trainer's retention removed."""
    async with sessions() as session:
        row = await policies.get_policy(session, version)
        if row.path is None:
            raise NotFound(f"policy version {version} has no adapter folder")
        if not row.weights_kept:
            raise policies.WeightsRemoved(version)
        return Version(row.version, row.name, row.path, row.status)


async def ensure_loaded(sessions: async_sessionmaker[AsyncSession], adapters: EngineAdapters, version: int, *,
                        engines: list[str] | None = None, metrics: fleet.FleetMetrics | None = None) -> Version:
    """Make `version`'s adapter, with the weights in its own folder, loaded and verified on every replica (or on
    those in `engines`) by the rules above: replaced unless it serves now. Raises LoadFailed (an AdapterError)
    unless every one of them verified it (those that did not are recorded out of rotation for it)."""
    policy = await read(sessions, version)
    committed = await fleet.commit(sessions, adapters, version, engines=engines, metrics=metrics)
    if committed.withheld:
        raise LoadFailed(f"{policy.name} is not verified on every engine: "
                         + "; ".join(str(e) for e in committed.withheld.values()), committed.withheld,
                         name=policy.name)
    return policy


async def publish(sessions: async_sessionmaker[AsyncSession], adapters: EngineAdapters, version: int, *,
                  activate: bool = False, drain: Drain | None = None, probe: bool = True,
                  metrics: fleet.FleetMetrics | None = None, replacing: int | None = None) -> fleet.Committed:
    """Commit a new candidate to the fleet (engine/fleet.py: loaded on every replica, replacing anything under
    its name, and verified); with `activate`, then make it the one served (the policy it replaces goes to
    `drain`). Without a majority of replicas verifying it, it is marked failed (the serving policy is
    untouched) and LoadFailed is raised. Returns what was committed where, and how long it took. `probe`: see
    fleet.commit. `replacing`: activate only if that version still serves (store.policies.activate), else
    ActiveChanged, the candidate committed but not serving.

    A candidate or canary that a stopped trainer left may be published again (a canary keeps its copies)."""
    policy = await read(sessions, version)
    if policy.status not in (PolicyStatus.CANDIDATE, PolicyStatus.CANARY):
        raise Conflict(f"policy version {version} is {policy.status}, not a candidate to publish")
    try:
        committed = await fleet.commit(sessions, adapters, version, probe=probe, metrics=metrics)
    except AdapterError:
        async with sessions() as session, session.begin():
            await policies.set_status(session, version, PolicyStatus.FAILED)
        raise
    if activate:
        await _make_active(sessions, version, drain, replacing=replacing)  # loaded fresh just now: no second load
    return committed


async def activate(sessions: async_sessionmaker[AsyncSession], adapters: EngineAdapters, version: int, *,
                   drain: Drain | None = None, policy: str = policies.DEFAULT_POLICY,
                   metrics: fleet.FleetMetrics | None = None, replacing: int | None = None) -> policies.ActivePolicy:
    """Make `version` the one its policy serves (0: `policy` goes back to the base model), e.g. a rollback:
    its adapter is committed to the fleet first (loaded from its own folder, unless it serves already, and
    verified; a minority of replicas that cannot are out of rotation for it). Returns the
    version it replaced, which stops serving: given to `drain` if there is one (else a trainer's `Drain` sees
    it stop). NotFound for an unknown or failed version; LoadFailed when most replicas cannot verify it, and
    then nothing changed."""
    if version != policies.BASE_VERSION:
        policy = await read(sessions, version)
        if policy.status == PolicyStatus.FAILED:
            raise NotFound(f"policy version {version} failed to load and cannot be activated")
        await fleet.commit(sessions, adapters, version, metrics=metrics)
    return await _make_active(sessions, version, drain, policy, replacing=replacing)


async def start_canary(sessions: async_sessionmaker[AsyncSession], adapters: EngineAdapters, version: int,
                       fraction: float, **scope) -> canaries.Canary:
    """Make a candidate answer `fraction` of new rollouts (store/canary.start, which takes `scope`: traffic,
    eval_agents); idempotent for the canary already running. Its adapter is committed to the fleet first, as
    for `activate`."""
    await fleet.commit(sessions, adapters, version)
    async with sessions() as session, session.begin():
        return await canaries.start(session, version, fraction, **scope)


async def retire(sessions: async_sessionmaker[AsyncSession], version: int, *,
                 drain: Drain | None = None) -> bool:
    """A version that will not serve (a gate kept it out); `drain` unloads its copies. False, and nothing
    changed, when it serves already as the active version (an operator activated it while the gate ran)."""
    async with sessions() as session, session.begin():
        now = await policies.retire_unserved(session, version)
        name = (await policies.get_policy(session, version)).name
    if now is not None:
        log.warning("v%d is %s (an operator's choice while its gate ran): left as it is, not retired", version, now)
        return False
    if drain is not None:
        drain.note(name)
    return True


async def _make_active(sessions: async_sessionmaker[AsyncSession], version: int, drain: Drain | None,
                       policy: str = policies.DEFAULT_POLICY, *, replacing: int | None = None) -> policies.ActivePolicy:
    async with sessions() as session, session.begin():
        if version != policies.BASE_VERSION:
            policy = await policies.policy_of(session, version)
        previous = await policies.active_policy(session, policy)
        await policies.activate(session, version, policy, replacing=replacing)
    if drain is not None and previous.version != version:
        drain.note(previous.name)
    return previous


class Drain:
    """Unloads the adapters of versions that stopped serving, `drain_seconds` after they did (the proxies switch
    within their refresh interval; a request the old version was answering that runs longer than the drain —
    upstream_timeout allows up to 600 s — fails when its adapter is unloaded).

    It unloads what it saw stop serving (between two sweeps, or told by `note`), not every retired version
    it finds loaded: an operator may have loaded one to evaluate it (`rlproxy eval --upstream`)."""

    def __init__(self, drain_seconds: float) -> None:
        self.drain_seconds = drain_seconds
        self._since: dict[str, float] = {}  # adapter name -> when it stopped serving
        self._serving: set[str] | None = None  # names serving at the last sweep

    def draining(self, name: str | None) -> bool:
        """Whether `name` stopped serving and is not unloaded yet (its folder must stay: a replica may reload it)."""
        return name in self._since

    def note(self, name: str | None) -> None:
        """`name` stopped serving (or never will) now; unloaded by a sweep `drain_seconds` from now."""
        if name is not None:
            self._since.setdefault(name, time.monotonic())

    async def sweep(self, sessions: async_sessionmaker[AsyncSession], adapters: EngineAdapters) -> list[str]:
        """Note what stopped serving since the last sweep, unload what is due; returns the names unloaded."""
        async with sessions() as session:
            lines = await canaries.serving_all(session)
        serving = {p.name for line in lines.values() for p in (line.active, line.canary)
                   if p is not None and p.name is not None}
        for name in (self._serving or set()) - serving:
            self.note(name)
        self._serving = serving
        now = time.monotonic()
        unloaded = []
        for name, since in list(self._since.items()):
            if name in serving:  # serving again (a rollback to it): not ours to unload
                del self._since[name]
            elif now - since >= self.drain_seconds:
                try:
                    await adapters.unload(name)
                except AdapterError as exc:
                    log.warning("could not unload %s (trying again in %.0f s): %s", name,
                                self.drain_seconds, exc)
                    self._since[name] = now
                else:
                    del self._since[name]
                    unloaded.append(name)
        return unloaded
