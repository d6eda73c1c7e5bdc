"""Committing a policy version's adapter to the engine fleet: every replica that serves a version serves the
same weights, checked, and a replica that cannot is out of rotation for it until it can.

    committed = await fleet.commit(sessions, adapters, version)   # load on every replica, verify, record
    committed.verified, committed.withheld                        # replica URLs; URL -> the error keeping it out

engine/adapters.py loads; engine/lifecycle.py decides when a version is committed (publish, activation,
canary, a replica that lost it); this module decides whether each replica's copy is the version's own weights.

(a) The digest. The adapter folder is hashed (SHA-256 over the relative names and contents of the files an
    engine reads, `folder_digest`) when the version is first committed, and the digest is recorded with it. Every replica
    loads that folder; afterwards it is hashed again, since a folder rewritten while the replicas read it may
    have given them different weights (then no replica keeps it). vLLM does not say what it read, so a later
    load (a restarted replica, a retry) is checked against the recorded digest first: a folder that changed
    since is never loaded again. Only a process that can read the folder checks it (the trainer, which wrote
    it; the chart's proxies do not mount the adapters volume and rely on (b)).
(b) The probe. Each replica that loaded the adapter completes PROBE_PROMPT under the adapter's name, one token
    at temperature 0 with logprobs. Its top token must be the reference's and its logprob within
    PROBE_TOLERANCE of the reference's. The reference is the answer most replicas agree on at the first
    commit, recorded with the digest; every later load is compared with it. One token is a coarse test: it
    tells a replica holding other weights (another adapter, another base model, a stale copy of a
    much older version) apart, not necessarily two versions one small step apart, which (a) tells apart.
    A version first committed to a single replica is not probed, then or later: there is nothing to compare.

The rules:
* A version that serves nothing yet is committed when a strict majority of the replicas verify it; the others
  are withheld. With fewer (a split vote included) nothing keeps it: LoadFailed, and it never serves.
* A version that serves already is committed replica by replica (a restarted replica, a retry): each one
  verified rejoins, each other is withheld. A replica whose copy failed the probe has that copy unloaded.
* The proxies route a version's calls only to replicas not withheld from it (proxy/upstream.py: rendezvous
  hashing over those, so the rollouts of the other replicas stay where their prefix caches are), and each
  proxy retries the withheld replicas of serving versions in the background (`Rejoiner`), with exponential
  backoff, until one verifies or the version stops serving. The version that served before keeps every
  replica meanwhile, and is unloaded only after its drain (lifecycle.Drain), so its calls in flight finish.

Where "withheld" lives: in the store (store/replicas.py), beside the version. Every proxy reads what serves
from the store on each policy refresh (once a second); reading the withheld replicas in the same look means
every proxy, however many, routes by the same facts within a second, a restarted proxy knows at once, and
whoever found the failure (the trainer publishing, a proxy retrying) needs no channel to the proxies. A row per
(version, replica) rather than a field of the policy row, because the trainer, its gates and every proxy
write them concurrently, and each such write must stand alone.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential, wait_random

from engine.adapters import AdapterError, EngineAdapters, LoadFailed
from store import policies, replicas
from store.errors import NotFound
from store.models import PolicyStatus
from store.replicas import FleetRecord, Probe

log = logging.getLogger("engine.fleet")

SERVING = (PolicyStatus.ACTIVE, PolicyStatus.CANARY)
PROBE_PROMPT = "The three primary colours are"
# Nats. Replicas with the same weights differ by less: vLLM's batch-dependent kernels move a logprob by
# around 1e-3 to 1e-2 in bf16. An adapter with other weights moves it by tenths, or changes the token.
PROBE_TOLERANCE = 0.05
LOAD, FOLDER, PROBE = "load", "folder", "probe"  # why a replica is withheld (the metric's `reason`)


class NotVerified(AdapterError):
    """A replica is not serving the version's weights: `reason` FOLDER (the folder is not the one committed)
    or PROBE (its answer to the probe differs from the reference, or it gave none)."""

    def __init__(self, message: str, *, reason: str, engine: str | None = None, name: str | None = None) -> None:
        super().__init__(message, engine=engine, name=name)
        self.reason = reason


def reason_of(error: AdapterError) -> str:
    return error.reason if isinstance(error, NotVerified) else LOAD


class FleetMetrics:
    """The fleet's counters, registered by the proxy's and by the trainer's metrics under the same names (each
    counts what it did: sum over both jobs)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.withheld = Counter(
            "rlproxy_fleet_withheld_total",
            "Replicas taken (or kept, by a failed retry) out of rotation for a policy version, by why: it could "
            "not load the adapter (load), the adapter folder is not the one committed (folder), or its answer "
            "to the probe differs from the version's reference (probe).", ["replica", "reason"], registry=registry)
        self.rejoined = Counter("rlproxy_fleet_rejoined_total",
                                "Replicas back in rotation for a policy version after a retry verified them.",
                                ["replica"], registry=registry)


@dataclass(slots=True, frozen=True)
class Committed:
    version: int
    name: str
    seconds: float
    verified: tuple[str, ...]
    withheld: dict[str, AdapterError]  # replica -> why it is out of rotation for this version


@dataclass(slots=True, frozen=True)
class _Target:
    version: int
    name: str
    path: str
    policy: str
    serving: bool
    record: FleetRecord | None


# What only a resuming trainer reads, never an engine: left out of the digest, so that retention may drop a
# version's optimizer state (trainer/retention.py) and its folder still verifies (and a third as much is hashed).
RESUME_ONLY = frozenset({"optimizer.pt", "trainer_state.json", "adapter_master.safetensors"})


def folder_digest(path: str | Path, *, resume_files: bool = False) -> str | None:
    """"sha256:…" over the files in the folder an engine reads (relative names and contents, in name order;
    `resume_files`: every file, as digests recorded before RESUME_ONLY were made); None when the folder cannot
    be read here."""
    root = Path(path)
    digest = hashlib.sha256()
    try:
        files = sorted(p for p in root.rglob("*") if p.is_file() and (resume_files or p.name not in RESUME_ONLY))
        if not files:
            return None
        for file in files:
            digest.update(file.relative_to(root).as_posix().encode() + b"\0")
            with file.open("rb") as handle:
                while chunk := handle.read(1 << 20):
                    digest.update(chunk)
            digest.update(b"\0")
    except OSError:
        return None
    return "sha256:" + digest.hexdigest()


def agrees(answer: Probe, reference: Probe, tolerance: float = PROBE_TOLERANCE) -> bool:
    return answer.token == reference.token and abs(answer.logprob - reference.logprob) <= tolerance


def consensus(answers: Iterable[Probe], tolerance: float = PROBE_TOLERANCE) -> Probe | None:
    """The answer the most others agree with (the first such), or None for no answers."""
    answers = list(answers)
    best, support = None, 0
    for candidate in answers:
        count = sum(agrees(other, candidate, tolerance) for other in answers)
        if count > support:
            best, support = candidate, count
    return best


async def commit(sessions: async_sessionmaker[AsyncSession], adapters: EngineAdapters, version: int, *,
                 engines: Sequence[str] | None = None, probe: bool = True,
                 metrics: FleetMetrics | None = None) -> Committed:
    """Load `version`'s adapter on every replica (or those in `engines`), verify each copy and record which
    replicas serve it (module docstring). Raises LoadFailed when a version that serves nothing yet is not
    verified by a strict majority (then no replica keeps it). `probe`: False checks the digest only (replicas
    known to answer differently, e.g. a stand-in engine beside a real one); the record then holds no probe,
    and later commits of the version do not probe either."""
    target = await _read(sessions, version)
    engines = adapters.engines if engines is None else tuple(e.rstrip("/") for e in engines)
    if not engines:
        return Committed(version, target.name, 0.0, (), {})
    if target.record is not None and target.record.prompt is None:
        probe = False  # committed without a probe: there is no reference to compare a later answer with
    elif target.record is None and len(engines) == 1:
        probe = False  # a fleet of one has nothing to compare its answer with (and a probe costs a forward pass)
    began = time.perf_counter()
    digest = await asyncio.to_thread(folder_digest, target.path)
    recorded = target.record.digest if target.record else None
    if digest and recorded and digest != recorded and \
            await asyncio.to_thread(folder_digest, target.path, resume_files=True) == recorded:
        recorded = digest  # recorded over every file, before RESUME_ONLY: the same folder
    if digest and recorded and digest != recorded:
        error = NotVerified(f"{target.path} is not the folder v{version} was committed with ({digest} now, "
                            f"{recorded} then): no replica loads it", reason=FOLDER, name=target.name)
        outcome: dict[str, AdapterError | None] = dict.fromkeys(engines, error)
    else:
        outcome = await _load_each(adapters, target, engines)
    loaded = [e for e in engines if outcome[e] is None]
    if loaded and digest and await asyncio.to_thread(folder_digest, target.path) != digest:
        error = NotVerified(f"{target.path} changed while the replicas loaded it", reason=FOLDER, name=target.name)
        outcome.update(dict.fromkeys(loaded, error))
    reference = target.record.probe if target.record else None
    quorum = target.serving or 2 * len(loaded) > len(engines)  # too few loaded: nothing to probe for
    if probe and quorum and any(outcome[e] is None for e in engines):
        reference = await _verify_probes(adapters, target, engines, outcome, reference)
    verified = tuple(e for e in engines if outcome[e] is None)
    withheld = {e: error for e in engines if (error := outcome[e]) is not None}
    wrong_copies = [e for e in loaded if e in withheld]  # loaded, but not the version's weights
    if not target.serving and 2 * len(verified) <= len(engines):
        await _unload_quietly(adapters, target.name, loaded)
        raise LoadFailed(f"v{version} ({target.name} from {target.path}) is verified on {len(verified)} of "
                         f"{len(engines)} replicas, not a majority: "
                         + "; ".join(f"{e}: {error}" for e, error in withheld.items()), withheld, name=target.name)
    await _unload_quietly(adapters, target.name, wrong_copies)
    async with sessions() as session, session.begin():
        if target.record is None and not target.serving:
            await replicas.set_fleet_record(session, version, FleetRecord(
                digest, reference if probe else None, PROBE_PROMPT if probe else None))
        for engine in engines:
            error = outcome[engine]
            await replicas.mark(session, version, engine, replicas.VERIFIED if error is None else replicas.WITHHELD,
                                digest=digest, reason=None if error is None else f"{reason_of(error)}: {error}")
    for engine, error in withheld.items():
        if metrics is not None:
            metrics.withheld.labels(engine, reason_of(error)).inc()
        log.warning("replica %s is out of rotation for v%d (%s, policy %r; retried in the background while it "
                    "serves): %s", engine, version, target.name, target.policy, error)
    return Committed(version, target.name, time.perf_counter() - began, verified, withheld)


async def rejoin(sessions: async_sessionmaker[AsyncSession], adapters: EngineAdapters, version: int,
                 replica: str, *, metrics: FleetMetrics | None = None) -> bool:
    """Try a replica that is out of rotation for `version` again. True once it is verified; False when the
    version no longer serves (nothing to do: loading it would leave a copy no drain unloads). Raises the
    AdapterError that keeps it out."""
    target = await _read(sessions, version)
    if not target.serving:
        return False
    committed = await commit(sessions, adapters, version, engines=[replica], metrics=metrics)
    if committed.withheld:
        raise next(iter(committed.withheld.values()))
    if metrics is not None:
        metrics.rejoined.labels(replica.rstrip("/")).inc()
    log.info("replica %s verified v%d (%s) and is back in rotation for it", replica, version, target.name)
    return True


class Rejoiner:
    """Retries, in the background, the replicas withheld from serving versions (`follow` is given them on each
    policy refresh): one task per (version, replica), exponential backoff from `first_wait` to `max_wait`
    seconds with jitter, until the replica verifies, or it is no longer withheld (another process verified
    it, the version stopped serving). Every proxy runs one; a load that another proxy made already is kept
    (a serving version's copy is never replaced), so concurrent retries do not undo each other.

    `adapters_for(urls)`: the adapter routes of those replicas (the proxy's pooled client and engine key)."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession],
                 adapters_for: Callable[[list[str]], EngineAdapters], *, metrics: FleetMetrics | None = None,
                 first_wait: float = 1.0, max_wait: float = 60.0) -> None:
        self.sessions = sessions
        self.adapters_for = adapters_for
        self.metrics = metrics
        self.first_wait, self.max_wait = first_wait, max_wait
        self._tasks: dict[tuple[int, str], asyncio.Task] = {}

    def follow(self, withheld: dict[int, Iterable[str]]) -> None:
        """Retry exactly these (version -> replicas) from now on."""
        wanted = {(version, replica) for version, urls in withheld.items() for replica in urls}
        for pair in set(self._tasks) - wanted:
            self._tasks.pop(pair).cancel()
        for pair in wanted:
            task = self._tasks.get(pair)
            if task is None or task.done():  # done: it succeeded, and the replica was withheld again since
                self._tasks[pair] = asyncio.create_task(self._retry(*pair), name=f"rejoin-v{pair[0]}-{pair[1]}")

    @property
    def retrying(self) -> set[tuple[int, str]]:
        return {pair for pair, task in self._tasks.items() if not task.done()}

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _retry(self, version: int, replica: str) -> None:
        await asyncio.sleep(self.first_wait)  # whoever withheld it tried just now
        def failed(state: RetryCallState) -> None:
            log.info("replica %s still out of rotation for v%d after %d tries (next in %.0f s): %s", replica,
                     version, state.attempt_number, state.upcoming_sleep,
                     state.outcome.exception() if state.outcome else "")

        # Any error is retried (the database may be away for a moment too); cancelling the task ends it.
        retrying = AsyncRetrying(wait=wait_exponential(multiplier=self.first_wait, max=self.max_wait)
                                 + wait_random(0, self.first_wait),
                                 retry=retry_if_exception_type(Exception), before_sleep=failed)
        async for attempt in retrying:
            with attempt:
                await rejoin(self.sessions, self.adapters_for([replica]), version, replica, metrics=self.metrics)


async def _read(sessions: async_sessionmaker[AsyncSession], version: int) -> _Target:
    async with sessions() as session:
        row = await policies.get_policy(session, version)
        if row.path is None:
            raise NotFound(f"policy version {version} has no adapter folder")
        record = FleetRecord.from_json((row.evaluation or {}).get(replicas.KEY))
        return _Target(row.version, row.name, row.path, row.policy, row.status in SERVING, record)


async def _load_each(adapters: EngineAdapters, target: _Target,
                     engines: Sequence[str]) -> dict[str, AdapterError | None]:
    """Each replica's load, alone: one that fails undoes only its own (a version that serves nothing yet is
    replaced on each replica, one that serves keeps a copy from its own folder; adapters.py)."""
    async def one(engine: str) -> AdapterError | None:
        try:
            await adapters.load(target.name, target.path, replace=not target.serving, engines=[engine])
        except LoadFailed as exc:
            return exc.failures.get(engine, exc)
        return None

    return dict(zip(engines, await asyncio.gather(*(one(e) for e in engines))))


async def _verify_probes(adapters: EngineAdapters, target: _Target, engines: Sequence[str],
                         outcome: dict[str, AdapterError | None], reference: Probe | None) -> Probe | None:
    """Probe every replica still in `outcome` as good; those without an answer that agrees with `reference`
    (or, without one, with the consensus) get their error. Returns the reference used."""
    prompt = (target.record.prompt if target.record else None) or PROBE_PROMPT
    probed = [e for e in engines if outcome[e] is None]
    answers = dict(zip(probed, await asyncio.gather(*(probe(adapters, e, target.name, prompt) for e in probed),
                                                    return_exceptions=True)))
    for engine, answer in answers.items():
        if isinstance(answer, AdapterError):
            outcome[engine] = answer
        elif isinstance(answer, BaseException):
            raise answer  # a bug, not an engine's answer
    good = {e: a for e, a in answers.items() if isinstance(a, Probe)}
    reference = reference or consensus(good.values())
    for engine, answer in good.items():
        if not agrees(answer, reference):
            outcome[engine] = NotVerified(
                f"{engine} answers the probe with {answer.token!r} at logprob {answer.logprob:.4f} under "
                f"{target.name}; the version's reference is {reference.token!r} at {reference.logprob:.4f} "
                f"(tolerance {PROBE_TOLERANCE})", reason=PROBE, engine=engine, name=target.name)
    return reference


async def probe(adapters: EngineAdapters, engine: str, name: str, prompt: str = PROBE_PROMPT) -> Probe:
    """One replica's answer to the probe under model `name`: the top token of a one-token completion at
    temperature 0, and its logprob. Raises NotVerified (reason PROBE) when it gives none."""
    body = {"model": name, "prompt": prompt, "max_tokens": 1, "temperature": 0, "logprobs": 1, "seed": 0}
    try:
        answer = await adapters.complete(engine, body)
    except AdapterError as exc:
        raise NotVerified(f"{engine} did not answer the probe under {name}: {exc}", reason=PROBE, engine=engine,
                          name=name) from None
    try:
        logprobs = answer["choices"][0]["logprobs"]
        return Probe(str(logprobs["tokens"][0]), float(logprobs["token_logprobs"][0]))
    except (KeyError, IndexError, TypeError, ValueError):
        raise NotVerified(f"{engine} answered the probe under {name} without logprobs: {str(answer)[:300]}",
                          reason=PROBE, engine=engine, name=name) from None


async def _unload_quietly(adapters: EngineAdapters, name: str, engines: list[str]) -> None:
    if not engines:
        return
    try:
        await adapters.unload(name, engines=engines)
    except AdapterError as exc:
        log.warning("could not unload %s from %s: %s", name, ", ".join(engines), exc)
