"""What agents report about their rollouts, taken in one place: a rollout opened (`POST /rollouts`: its tokens,
who gives its reward, the version that answers it), final and per-call rewards (`POST /reward`, a reward event, a
span's `rlproxy.reward`), a close, other rollout events, and the rewards in exported spans. The routes
(proxy/routes/rollouts.py, events.py, traces.py) parse and answer; this object does the rest, as CompletionServing
does for calls: it waits for the calls a report may refer to (the capture writer), stores in one transaction through
store/ (store/rewards.py writes every reward row), applies the ingest budgets, and counts what was stored."""
from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from core.settings import ProxySettings
from proxy.errors import PayloadTooLarge, Unprocessable
from proxy.metrics import ProxyMetrics
from proxy.otlp import (
    IGNORED_NO_ROLLOUT,
    IGNORED_NOTHING_TO_SCORE,
    REJECTED,
    SpanFacts,
    SpanResult,
    ToolWeights,
    has_rewards,
    store_span_rewards,
)
from proxy.policy import PolicyRouter
from proxy.recording import CaptureWriter
from proxy.schemas import RolloutCreate
from store import events as store_events
from store.closing import Closed, close_rollout
from store import rewards as reward_rows
from store import rollouts as store_rollouts
from store.keys import hash_key
from store.models import RewardKind
from store.reward_sources import RewardedBy, RewardSource
from store.rollout_tokens import GRADER_TOKEN_PREFIX, ROLLOUT_TOKEN_PREFIX, new_token


@dataclass(frozen=True, slots=True)
class Opened:
    """A rollout just created, with its credentials (shown once: the store keeps their hashes only)."""
    rollout_id: str
    token: str  # the agent's, scoped to this rollout
    reward_source: str
    grader_token: str | None  # only when its grader gives the final reward


def reward_source(body: RolloutCreate) -> str:
    """Who gives the new rollout's final reward: evaluation rollouts always take theirs from a grader (their
    rewards are the evidence the gates promote on), others from the agent unless told otherwise."""
    source = RewardSource.GRADER if body.reward_source == "runner" else body.reward_source
    if body.eval and source == RewardSource.JUDGE:
        raise Unprocessable("reward_source: an evaluation rollout is rewarded by its grader, not the judge (the "
                            "judge scores training rollouts only)", param="reward_source")
    if body.eval:
        return RewardSource.GRADER
    return source or RewardSource.AGENT


class RewardIngest:
    def __init__(self, settings: ProxySettings, sessions: async_sessionmaker[AsyncSession], writer: CaptureWriter,
                 metrics: ProxyMetrics, router: PolicyRouter) -> None:
        self.budget = settings.ingest
        self.weights = ToolWeights.of(settings)
        self.sessions = sessions
        self.writer = writer
        self.metrics = metrics
        self.router = router

    async def open(self, body: RolloutCreate, *, project: str | None) -> Opened:
        """A new rollout of `project`: its id, its tokens, who gives its reward, and the policy version that answers
        it (remembered by the router, so that its calls get the same)."""
        source = reward_source(body)
        token = new_token(ROLLOUT_TOKEN_PREFIX)
        grader = new_token(GRADER_TOKEN_PREFIX) if source == RewardSource.GRADER else None
        rollout_id = uuid.uuid4().hex
        async with self.sessions() as session, session.begin():
            await store_rollouts.create_rollout(
                session, rollout_id, task_id=body.task_id, agent=body.agent, metadata=body.metadata,
                project=project,
                policy_version=self.router.version_for_new(rollout_id, body.eval, body.agent, project),
                eval=body.eval, reward_source=source, token_hash=hash_key(token),
                grader_token_hash=hash_key(grader) if grader is not None else None,
            )
        return Opened(rollout_id, token, source, grader)

    async def reward(self, rollout_id: str, value: float, *, project: str | None, call_id: str | None = None,
                     task_id: str | None = None, metadata: dict[str, Any] | None = None,
                     giver: str = RewardedBy.AGENT) -> store_rollouts.RewardResult:
        """A final reward (no `call_id`: closes the rollout) or one for a call, bounded per call; from `giver`
        (proxy/edge/token_scope.py `reward_giver`), so a rollout whose grader gives its reward keeps anyone else's as a
        claim."""
        await self.writer.sync()  # the calls this reward refers to may still be on their way to the database
        try:
            async with self.sessions() as session, session.begin():
                result = await store_rollouts.post_reward(session, rollout_id, value, call_id=call_id,
                                                          task_id=task_id, metadata=metadata, project=project,
                                                          giver=giver)
                if call_id is not None and not result.claim:  # locked: refused here, never committed
                    await reward_rows.check_call_rewards(session, call_id, self.budget.max_rewards_per_call)
        except reward_rows.TooManyCallRewards as exc:
            raise PayloadTooLarge(f"{exc} (--max-rewards-per-call)", code="too_many_rewards") from None
        if result.claim:
            self.count_claim(result, giver)
        elif result.created:
            self._count(result, giver)
        return result

    async def close(self, rollout_id: str, *, project: str | None, giver: str = RewardedBy.AGENT) -> Closed:
        """The rollout closed without a final reward (store/closing.py `close_rollout`), once the calls on their
        way are stored; a close by one who does not give the rollout's end is counted as a claim."""
        await self.writer.sync()
        async with self.sessions() as session, session.begin():
            result = await close_rollout(session, rollout_id, project=project, giver=giver)
        if result.claim:
            self.metrics.reward_claims.labels("close", giver).inc()
        return result

    def count_claim(self, result: store_rollouts.RewardResult, giver: str) -> None:
        """A reward kept as a claim (or, past the rollout's bound on claims, refused alike): counted, so a run
        whose agents post rewards they do not give shows."""
        self.metrics.reward_claims.labels("final" if result.call_id is None else "call", giver).inc()

    async def event(self, rollout_id: str, event_type: str, data: Any, *, project: str | None) -> None:
        """An event other than a reward, kept with the rollout within its budget."""
        try:
            async with self.sessions() as session, session.begin():
                await store_events.add_event(session, rollout_id, event_type, data, project=project,
                                             max_events=self.budget.max_rollout_events)
        except store_events.TooManyEvents as exc:
            raise PayloadTooLarge(f"{exc} (--max-rollout-events)", code="too_many_events") from None

    async def spans(self, spans: Iterable[SpanFacts], *, project: str | None,
                    giver: str = RewardedBy.AGENT) -> list[SpanResult]:
        """The rewards of an export's spans, one transaction per rollout; what each span came to."""
        results: list[SpanResult] = []
        by_rollout: dict[str, list[SpanFacts]] = defaultdict(list)
        for span in spans:
            if span.rollout_id is None and span.reward_error is not None:  # a reward for a rollout it cannot name
                results.append(SpanResult(REJECTED, f"span {span.span_id}: {span.reward_error}"))
            elif span.rollout_id is None:
                results.append(SpanResult(IGNORED_NO_ROLLOUT))
            elif not has_rewards(span, self.weights):
                results.append(SpanResult(IGNORED_NOTHING_TO_SCORE))
            else:
                by_rollout[span.rollout_id].append(span)
        self._within_export_budget(sum(map(len, by_rollout.values())))
        if by_rollout:
            await self.writer.sync()
        for rollout_id, rollout_spans in by_rollout.items():
            async with self.sessions() as session, session.begin():
                stored = await store_span_rewards(session, rollout_id, rollout_spans, project, self.weights,
                                                  self.budget.max_rewards_per_call, giver)
            for result in stored:  # once committed
                if result.claim is not None:
                    self.count_claim(result.claim, giver)
                for reward in ([result.final] if result.final else []) + result.call_rewards:
                    self._count(reward, giver)
                for reason, policy in result.air:
                    self.metrics.rewards.labels(RewardKind.AIR, reason, "" if policy is None else str(policy)).inc()
            results += stored
        for result in results:
            self.metrics.otlp_spans.labels(result.outcome).inc()
        return results

    def _within_export_budget(self, spans_with_rewards: int) -> None:
        """The whole export is refused, before anything of it is stored, when more of its spans carry rewards than
        one export may store: each is a row, and a partial store would leave the sender guessing what to resend."""
        limit = self.budget.max_rewards_per_export
        if spans_with_rewards > limit:
            raise PayloadTooLarge(f"{spans_with_rewards} spans of the export carry rewards; one export may carry at "
                                  f"most {limit} (--max-rewards-per-export): send them in smaller batches",
                                  code="too_many_rewards")

    def _count(self, result: store_rollouts.RewardResult, giver: str) -> None:
        """The metrics of a final or per-call reward just stored (an evaluation rollout's counts as evaluation
        evidence only from an evaluation credential, as `GET /policies` counts it)."""
        kind = "final" if result.call_id is None else "call"
        self.metrics.rewards.labels(kind, "", "").inc()
        if kind == "final":
            self.metrics.reward_value.labels(str(self.router.version_for(result.rollout_id))).observe(result.reward)
            if result.eval and giver in RewardedBy.EVIDENCE:  # by the version that served it (`policy_version`)
                version = "" if result.policy_version is None else str(result.policy_version)
                self.metrics.eval_reward_value.labels(version).observe(result.reward)
