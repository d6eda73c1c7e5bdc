"""The trainer worker (`rlproxy train`), top to bottom:

    resume each named policy it trains from its active adapter (or the base model)
    loop:
        claim ready rollouts (finished, rewarded, untrained; whole task groups) with a lease
        for each policy: build transitions from the recorded token ids of the calls it answered (credit and
            advantages from the shared episode reward, prefix merging), one PPO step, save the adapter
        record the versions and mark the rollouts trained, in one transaction
        publish each: load into every engine, then activate (the proxies switch within a second)

Several policies are trained in turn on one model copy: before a policy's step its adapter (with its optimizer
state) is loaded from its folder. One process, not one per policy, because the rollout is what is claimed and
marked trained (a multi-agent episode feeds every role's policy from one reward), and one copy of the base
model is what a single accelerator holds; with one policy (the default) nothing is ever swapped. Which version
each policy trains from, and what moves it (a publish, a gate, an operator's activation), is trainer/lines.py's.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import shutil
import statistics
import time
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from core.settings import TrainerSettings
from core.step_record import StepRecord
from store import policies, training
from store.db import open_database, session_factory
from store.errors import LeaseLost
from store.models import utcnow
from trainer.agreement import AgreementWatch
from trainer.claim import claim_batch
from trainer.distill import IdleCloser, attach_reports, observe_teacher, policy_transitions, start_distillers
from trainer.failures import NOT_THE_BATCH, STEP_FAILED, FailedBatches, StepAttempts, describe
from trainer.housekeeping import Housekeeping
from trainer.lines import Line, Lines, Trained
from trainer.liveness import Heartbeat
from trainer.metrics import TrainerMetrics
from trainer.parallel import Collective, LeaderPolicy
from trainer.ppo import PolicyTrainer
from trainer.publish import Publisher
from trainer.retention import AdapterRetention, NoRoomForAdapter
from trainer.retokenize import retokenize
from trainer.staleness import Staleness
from trainer.step_report import merged as _merged, observe_step, reasons as _reasons, step_line
from trainer.transitions import SkipReasons, Transition
from trainer.waiting import log_waiting_yield
from trainer.seq_len import with_engine_seq_len
from trainer.yields import StepYield, YieldWatch

log = logging.getLogger("rlproxy.trainer")


class TrainerWorker:
    def __init__(self, settings: TrainerSettings, model_path: Path,
                 metrics: TrainerMetrics | None = None, on_published=None, while_computing=None,
                 collective: Collective | None = None) -> None:
        self.settings = settings
        self.model_path = model_path
        self.metrics = metrics or TrainerMetrics()
        # Entered while a step computes, for a host that shares the machine's cores (the demo pauses its agents).
        self.while_computing = while_computing or contextlib.nullcontext
        self.database = open_database(settings.database_url)
        self.sessions: async_sessionmaker[AsyncSession] = session_factory(self.database)
        engine_key = settings.upstream_api_key.get_secret_value() if settings.upstream_api_key else None
        self.publisher = Publisher(self.sessions, settings.upstreams, drain_seconds=settings.drain_seconds,
                                   api_key=engine_key, metrics=self.metrics.fleet)
        self.housekeeping = Housekeeping(settings, self.sessions, self.metrics)
        self.retention = AdapterRetention(self.sessions, settings.adapters_dir, settings.keep_versions,
                                          self.publisher.drain)
        self.agreement = AgreementWatch(settings.agreement_alarm_kl, self.metrics)
        self.yields = YieldWatch(self.metrics, settings.training)  # the yield ALERTs, over the last steps
        self.policy = None  # trainer.ppo.PolicyTrainer, built on start (torch is imported lazily)
        self.collective = collective or Collective()  # several ranks: this worker is rank 0 (trainer/parallel.py)
        self.heartbeat = Heartbeat(settings.heartbeat_dir, self.collective.rank)  # what the liveness probe reads
        # on_published: async callback(version) -> bool | None, an eval gate (trainer/lines.py)
        self.keeper = Lines(settings.policies, self.sessions, self.publisher, self.metrics, on_published)
        self.lines = self.keeper.lines
        self.loaded: str | None = None  # the policy whose parent adapter the model holds now
        self._last_saved = 0  # the newest version number this worker has saved
        self.steps = 0
        self.tokenizer = None  # only for token_source="retokenized"
        self.failures = FailedBatches()
        # This run's lease owner: the worker id and a token, so that leases are fenced per process (a second
        # process started with the same id takes back the first's leases, and the first's step is then not
        # recorded, rather than both training the same rollouts).
        self.lease_owner = f"{settings.worker_id}:{secrets.token_hex(4)}"
        self.attempts = StepAttempts(self.sessions, settings.worker_id, self.lease_owner, self.metrics)
        self.distillers: dict = {}  # policy -> trainer.distill.Distiller, for the policies with a teacher
        self.closer = IdleCloser(self.sessions, settings, [])

    async def start(self) -> None:
        self.settings = await with_engine_seq_len(self.settings)  # max_seq_len 0: the engines' max_model_len
        self.distillers = await start_distillers(self.settings, self.model_path)  # refuses a foreign tokenizer
        self.closer = IdleCloser(self.sessions, self.settings, list(self.distillers))
        await self.attempts.set_aside_unfinished()  # before their leases are released below
        async with self.sessions() as session, session.begin():
            released = await training.release_untrained(session, self.settings.worker_id)
            await self.keeper.resume(session)
        if released:
            log.info("took back %d rollouts leased by an earlier run of %r", released, self.settings.worker_id)
        for line in self.lines.values():
            log.info("policy %r resumes from v%d (%s)", line.policy, line.parent_version,
                     line.parent_path or "base model")
            self.keeper.observe(line)
        await log_waiting_yield(self.sessions, self.settings, {n: ln.parent_version for n, ln in self.lines.items()})
        first = self.lines[self.settings.policies[0]]
        if self.collective.world_size > 1:
            self.policy = await asyncio.to_thread(LeaderPolicy.start, self.build_policy, first.parent_path,
                                                  self.collective)
        else:
            self.policy = await asyncio.to_thread(self.build_policy, first.parent_path)
        self.loaded = first.policy
        await self._publish_leftover_candidates()
        await self._sweep()

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        await self.start()
        try:
            while not stop.is_set():
                self.heartbeat.beat()
                if self.settings.max_steps is not None and self.steps >= self.settings.max_steps:
                    break
                await self.housekeeping.run_due()
                if not await self.step_once():
                    try:
                        await asyncio.wait_for(stop.wait(), self.settings.poll_interval)
                    except asyncio.TimeoutError:
                        pass
            # Only on a clean stop: after a failure other ranks may be inside a step's collective; torchrun
            # stops them when this process exits.
            await asyncio.to_thread(self.policy.close)
        finally:
            await self.database.dispose()

    def build_policy(self, adapter_dir: Path | None):
        return PolicyTrainer(self.model_path, self.settings.training, adapter_dir, self.collective)

    async def step_once(self) -> bool:
        """Claim, train each policy, publish. False when nothing was ready."""
        await self.publisher.unload_drained()
        if not self.retention.room_for_save(self.policy, self.metrics):
            return False
        rollout_ids = await self._claim()
        if not rollout_ids:
            return False
        if self.collective.world_size > 1:  # one process catches a failing step itself (_failed)
            await self.attempts.begin(rollout_ids)
        try:
            return await self._train(rollout_ids)
        except NoRoomForAdapter:
            self.loaded = None  # the weights hold the unsaved update: the next step loads its parent again
            async with self.sessions() as session, session.begin():
                await training.release(session, rollout_ids, self.lease_owner)
            return False
        except LeaseLost as exc:
            self.loaded = None  # the weights hold the unrecorded update: the next step loads its parent again
            self.metrics.lost_leases.inc()
            log.error("ALERT: %s: its lease ran out during the step (lease_seconds) or another trainer with worker "
                      "id %r took its rollouts; whoever holds them trains them", exc, self.settings.worker_id)
            return True
        except NOT_THE_BATCH:
            raise
        except Exception as exc:  # noqa: BLE001 — a batch this trainer cannot digest (trainer/failures.py)
            if self.collective.world_size > 1:  # other ranks may be inside the step's collective: every rank
                await self.attempts.failed(rollout_ids, exc)  # exits, and the restart sets the batch aside
                raise
            await self._failed(rollout_ids, exc)
            return True

    async def _failed(self, rollout_ids: list[str], exc: Exception) -> None:
        """Release the batch for one more try, or (failed before) set it aside, recorded as a step with its reason."""
        self.policy.optimizer.zero_grad(set_to_none=True)  # a backward may have run: no gradient carries over
        self.loaded = None  # the weights may hold part of an update: the next step loads its adapter again
        again = self.failures.failed_before(rollout_ids)
        async with self.sessions() as session, session.begin():
            if not again:
                await training.release(session, rollout_ids, self.lease_owner)
            else:
                try:
                    await training.hold_leases(session, rollout_ids, self.lease_owner)
                except LeaseLost:  # another trainer holds them now: theirs to train or set aside
                    log.exception("a step over %d rollouts failed twice, and they are no longer this trainer's",
                                  len(rollout_ids))
                    return
                await training.record_step(session, rollout_ids, self.lease_owner, policy_version=None,
                                           transition_count=0, undecided=STEP_FAILED, metrics={
                                               "failed": describe(exc), "skipped": {STEP_FAILED: len(rollout_ids)}})
        if not again:
            log.exception("a step over %d rollouts failed; they are tried once more", len(rollout_ids))
            return
        self.metrics.skipped.labels(STEP_FAILED).inc(len(rollout_ids))
        log.error("ALERT: a step over %d rollouts failed again (%s); they are set aside as %s, recorded in the "
                  "step record, and training goes on", len(rollout_ids), describe(exc), STEP_FAILED)

    async def _train(self, rollout_ids: list[str]) -> bool:
        async with self.sessions() as session:
            rollouts = await training.load_rollouts(session, rollout_ids)
            if self.settings.training.token_source == "retokenized":
                await self._retokenize(session, rollouts)
            lineages = {name: await policies.lineage(session, name) for name in self.lines}
            serving = {name: await policies.active_policy(session, name) for name in self.lines}
        for line in self.lines.values():
            if self.keeper.follow(line, serving[line.policy]) and self.loaded == line.policy:
                self.loaded = None  # _switch_to loads the line's version before its next step
        rewards = [r.reward for r in rollouts if r.reward is not None] or [0.0]  # closed without one: a teacher's
        self.metrics.reward_mean.set(statistics.fmean(rewards))
        self.metrics.reward_std.set(statistics.pstdev(rewards))

        began = time.perf_counter()
        trained: list[Trained] = []
        skipped: dict[str, dict[str, int]] = {}
        lags, ledger = Staleness(now=utcnow()), StepYield(rollouts, self.yields)  # every policy's
        for line in self.lines.values():
            skips, staleness, usable = SkipReasons(), Staleness(now=lags.now), set()
            distiller = self.distillers.get(line.policy)
            transitions = policy_transitions(rollouts, self.settings.training, line.parent_version, skips,
                                             taught=distiller is not None,
                                             policy=line.policy, lineage=lineages[line.policy], staleness=staleness,
                                             usable=usable)
            if distiller is not None and transitions:
                transitions, taught = await distiller.teach(transitions, await self._requests(distiller, transitions),
                                                            self.policy, skips)
                observe_teacher(self.metrics, line.policy, taught)
                log.info("step %d, policy %r: %s", self.steps + 1, line.policy, taught.describe())
            skipped[line.policy], calls = dict(skips), ledger.line(line.policy, skips)
            staleness.observe(self.metrics)
            lags.merge(staleness)
            if not transitions:
                continue
            await self._switch_to(line)
            if self.settings.training.token_source == "retokenized":
                await asyncio.to_thread(self._recompute_behaviour, transitions)
            wanted = self.settings.training
            usable_rollouts = len(usable)  # zero-advantage groups count: they are part of the batch's evidence
            lr_scale = wanted.lr_scale_for(usable_rollouts)
            step_began = time.perf_counter()
            async with self.while_computing():
                step_metrics = await asyncio.to_thread(self.policy.step, transitions, line.parent_version,
                                                       wanted.updates_for(usable_rollouts), lr_scale)
            record = StepRecord.of(step_metrics, skipped=dict(skips), reward_mean=statistics.fmean(rewards),
                                   rollouts=len(rollouts), usable_rollouts=usable_rollouts, lr_scale=lr_scale,
                                   policy=line.policy, staleness=staleness.as_dict(), **calls)
            observe_step(self.metrics, record, transitions, time.perf_counter() - step_began)
            agreement = self.agreement.check(line.policy, record)
            version, path = await self._save()
            trained.append(Trained(line, version, path, len(transitions), record, agreement))
            log.info("%s", step_line(self.steps + 1, record, version, time.perf_counter() - step_began,
                                     staleness.describe(), agreement))
        for reasons in skipped.values():
            for reason, count in reasons.items():
                self.metrics.skipped.labels(reason).inc(count)
        attach_reports(trained, self.distillers)  # the teacher gap in each taught policy's step record
        await self._finish(rollout_ids, trained, skipped, lags, ledger)
        if not trained:
            ledger.nothing_learned(len(rollouts), _reasons(_merged(skipped)), lags.describe())
            return True
        self.steps += 1
        self.metrics.steps.inc()
        self.metrics.rollouts_trained.inc(len(rollout_ids))
        for new in trained:
            self.metrics.policy_steps.labels(new.line.policy).inc()
            await self._publish(new.line, new.version, new.path, began)
        await self._sweep()
        return True

    async def _switch_to(self, line: Line) -> None:
        """Put `line`'s adapter (and optimizer state) in the model, unless it is there already."""
        if self.loaded != line.policy:
            await asyncio.to_thread(self.policy.load, line.parent_path)
            self.loaded = line.policy

    async def _retokenize(self, session: AsyncSession, rollouts: list[training.RolloutData]) -> None:
        from transformers import AutoTokenizer

        if self.tokenizer is None:
            self.tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, str(self.model_path))
        texts = await training.load_call_texts(session, [c.id for r in rollouts for c in r.calls])
        changed = retokenize(rollouts, texts, self.tokenizer)
        self.metrics.retokenized_mismatches.inc(changed)
        log.info("re-tokenized %d calls: %d sequences differ from the recorded ids",
                 sum(len(r.calls) for r in rollouts), changed)

    def _recompute_behaviour(self, transitions: list[Transition]) -> None:
        """What a text-only pipeline must do: take the trainer's own log-probs as the behaviour policy's."""
        for t, scores in zip(transitions, self.policy.logprobs(transitions)):
            mask = t.mask()
            t.behaviour_logprobs = [lp if keep else 0.0 for lp, keep in zip(scores, mask)]

    async def _requests(self, distiller, transitions: list[Transition]) -> dict[str, dict | None]:
        """call id -> recorded request of each transition's first call, where the teacher's context needs it."""
        if not distiller.needs_requests:
            return {}
        async with self.sessions() as session:
            texts = await training.load_call_texts(session, [t.call_id for t in transitions if t.call_id])
        return {call_id: request for call_id, (request, _) in texts.items()}

    async def _claim(self) -> list[str]:
        await self.closer.run_due()  # a taught policy's rollouts close without a reward too
        return await claim_batch(self.sessions, self.settings, self.metrics, self.lease_owner)

    async def _sweep(self) -> None:
        trains_from = {line.policy: line.parent_version for line in self.lines.values()}
        self.metrics.adapters_removed.inc(len(await self.retention.sweep(trains_from)))

    async def _save(self) -> tuple[int, Path]:
        if not self.retention.room_for_save(self.policy, self.metrics):
            raise NoRoomForAdapter(f"too little free space in {self.settings.adapters_dir} for a version")
        async with self.sessions() as session:
            # a step's versions are recorded together after the last policy's: number past those saved already
            version = max(await policies.next_version(session), self._last_saved + 1)
        self._last_saved = version
        path = (self.settings.adapters_dir / f"v{version}").resolve()
        if path.exists():  # left by a step that crashed before recording it: never published, safe to replace
            shutil.rmtree(path)
        await asyncio.to_thread(self.policy.save_adapter, path)
        return version, path

    async def _finish(self, rollout_ids: list[str], trained: list[Trained],
                      skipped: dict[str, dict[str, int]], lags: Staleness, ledger: StepYield) -> None:
        """Record each new version and mark the rollouts trained, in one transaction (a step per version)."""
        async with self.sessions() as session, session.begin():
            await training.hold_leases(session, rollout_ids, self.lease_owner)
            for new in trained:
                if new.agreement is not None:
                    await policies.record_agreement(session, new.agreement.version, new.agreement.as_dict())
                await policies.add_candidate(session, new.version, str(new.path), policy=new.line.policy,
                                             parent_version=new.line.parent_version,
                                             base_model=str(self.model_path), metrics=new.record.as_dict())
                await training.record_step(session, rollout_ids, self.lease_owner, policy_version=new.version,
                                           transition_count=new.transitions, metrics=new.record.as_dict())
            if not trained:
                await training.record_step(session, rollout_ids, self.lease_owner, policy_version=None,
                                           transition_count=0, metrics=ledger.untrained(_merged(skipped), lags))
            await training.store_decisions(session, rollout_ids, ledger.decisions)

    async def _publish(self, line: Line, version: int, path: Path, step_began: float) -> None:
        if not await self.keeper.publish(line, version, path, step_began) and self.loaded == line.policy:
            await asyncio.to_thread(self.policy.load, line.parent_path)  # back to the version that serves

    async def _publish_leftover_candidates(self) -> None:
        """A trainer stopped between recording a version and publishing it (or while its canary ran):
        publish it now (a canary resumes with its original start)."""
        for line, version, path in await self.keeper.leftovers():
            log.info("publishing v%d of %r left unpublished by an earlier run", version, line.policy)
            await asyncio.to_thread(self.policy.load, path)
            self.loaded = line.policy
            await self._publish(line, version, path, time.perf_counter())
