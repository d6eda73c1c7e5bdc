"""The rewards a rollout's spans carry, stored: a failed tool span as the automatic `tool_error` reward of the
call that asked for the tool, `rlproxy.reward` as a final reward (closing the rollout as `POST /reward` does)
or as a reward for one call. What the spans mean is read in proxy/otlp/export.py; this module finds the calls they
refer to and writes the rewards, all of one rollout's spans in one transaction under the rollout's row lock.

Replays are no-ops: an automatic reward is stored once per call and reason (the `uq_rewards_air` index), a
per-call reward once per span (its trace and span ids are kept in the reward's metadata and looked up under
the lock), and the same final reward again changes nothing, while a different one is refused (409 semantics).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from core.settings import ProxySettings
from proxy.otlp.export import SpanFacts, requested_tool_call_ids
from rewards.air import TOOL_ERROR, TOOL_SUCCESS
from store import calls as store_calls
from store import rewards as reward_rows
from store import rollouts as store_rollouts
from store.errors import Conflict, NotFound, NotYours
from store.models import as_utc
from store.reward_sources import RewardedBy

# What became of a span (`rlproxy_otlp_spans_total{outcome}`); a span with several rewards counts once, by the
# first of these that applies.
REJECTED = "rejected"  # at least one of its rewards was refused (partial_success.rejected_spans)
REWARDED_FINAL = "rewarded_final"
REWARDED_CALL = "rewarded_call"
CLAIMED = "claimed"  # its final reward was kept as a claim: the rollout's grader gives its reward
AIR = "air"
DUPLICATE = "duplicate"  # everything it carries was stored already (a replayed export)
IGNORED_NO_ROLLOUT = "ignored_no_rollout"
IGNORED_NOTHING_TO_SCORE = "ignored_nothing_to_score"
OUTCOMES = (REJECTED, REWARDED_FINAL, REWARDED_CALL, CLAIMED, AIR, DUPLICATE, IGNORED_NO_ROLLOUT, IGNORED_NOTHING_TO_SCORE)


@dataclass(frozen=True, slots=True)
class ToolWeights:
    """The AIR weights a tool span's status earns the call that asked for the tool (0: off)."""

    tool_error: float = -0.25
    tool_success: float = 0.0

    @classmethod
    def of(cls, settings: ProxySettings) -> ToolWeights:
        if not settings.air:
            return cls(0.0, 0.0)
        return cls(settings.air_tool_error, settings.air_tool_success)

    def for_span(self, span: SpanFacts) -> tuple[str, float] | None:
        """The reason and weight of the tool span's automatic reward; None when it earns none."""
        if not span.is_tool:
            return None
        reason, weight = (TOOL_ERROR, self.tool_error) if span.tool_failed else (TOOL_SUCCESS, self.tool_success)
        return (reason, weight) if weight != 0.0 else None


def has_rewards(span: SpanFacts, weights: ToolWeights) -> bool:
    """Whether the span carries anything to store (else it is ignored without reaching the database)."""
    return span.reward is not None or span.reward_error is not None or weights.for_span(span) is not None


@dataclass(slots=True)
class SpanResult:
    outcome: str
    error: str | None = None  # why (part of) it was refused
    final: store_rollouts.RewardResult | None = None  # a final reward it stored
    claim: store_rollouts.RewardResult | None = None  # a final reward kept as a claim (the grader gives it)
    call_rewards: list[store_rollouts.RewardResult] = field(default_factory=list)
    air: list[tuple[str, int | None]] = field(default_factory=list)  # (reason, serving policy) of AIR it stored


@dataclass(frozen=True, slots=True)
class _RecordedCall:
    id: str
    seq: int
    started_at: datetime
    policy_version: int | None


class _RolloutCalls:
    """The rollout's recorded calls, read once they are needed, and which of them a span refers to. Responses
    (to find the call that asked for a tool) are read newest first, `RESPONSES_AT_ONCE` at a time, and only
    until the tool call is found: a rollout of thousands of calls is never read whole into the event loop."""

    RESPONSES_AT_ONCE = 64

    def __init__(self, session: AsyncSession, rollout_id: str) -> None:
        self.session, self.rollout_id = session, rollout_id
        self._calls: list[_RecordedCall] | None = None
        self._asked: dict[str, str] = {}  # tool call id -> the call that asked for it, of the responses read
        self._read_below: int | None = None  # responses of calls with a lower seq are not read yet (None: none)
        self._all_read = False

    async def all(self) -> list[_RecordedCall]:
        if self._calls is None:
            rows = await store_calls.rollout_call_times(self.session, self.rollout_id)
            self._calls = [_RecordedCall(row.id, row.seq, as_utc(row.started_at), row.policy_version) for row in rows]
        return self._calls

    async def _asked_for(self, tool_call_id: str) -> str | None:
        """The id of the latest call whose response asked for the tool call."""
        while tool_call_id not in self._asked and not self._all_read:
            rows = await store_calls.call_responses_newest_first(self.session, self.rollout_id,
                                                                 below_seq=self._read_below,
                                                                 limit=self.RESPONSES_AT_ONCE)
            for row in rows:  # newest first: an id asked for twice names the latest call
                for asked in requested_tool_call_ids(row.route, row.response):
                    self._asked.setdefault(asked, row.id)
            self._all_read = len(rows) < self.RESPONSES_AT_ONCE
            self._read_below = rows[-1].seq if rows else self._read_below
        return self._asked.get(tool_call_id)

    async def target(self, span: SpanFacts, explicit: bool) -> _RecordedCall:
        """The call a span's reward is for: the one `rlproxy.call_id` names (when `explicit`), else the one whose
        response asked for the span's tool call, else the latest one that started before the span did.
        NotFound when there is none."""
        calls = await self.all()
        if explicit and span.call_id is not None:
            for call in calls:
                if call.id == span.call_id:
                    return call
            raise NotFound(f"call {span.call_id[:128]!r} is not part of rollout {self.rollout_id!r}")
        if span.tool_call_id is not None and (asking := await self._asked_for(span.tool_call_id)) is not None:
            for call in calls:
                if call.id == asking:
                    return call
        earlier = [c for c in calls if span.start is None or c.started_at <= span.start]
        if not earlier:
            raise NotFound(f"rollout {self.rollout_id!r} has no recorded call that started before span "
                           f"{span.span_id} ({span.name!r})")
        return earlier[-1]


@dataclass(slots=True)
class _CallRewards:
    """The per-call rewards the rollout holds: which spans gave them (replays) and how many each call has."""

    spans: set[tuple[str, str]]
    per_call: Counter[str]
    limit: int  # --max-rewards-per-call


async def store_span_rewards(session: AsyncSession, rollout_id: str, spans: Sequence[SpanFacts],
                             project: str | None, weights: ToolWeights, max_per_call: int,
                             giver: str = RewardedBy.AGENT) -> list[SpanResult]:
    """Store the rewards of one rollout's spans (inside the caller's transaction); one result per span, in no
    particular order. A rollout that does not exist, belongs to another project or has expired refuses all; a
    per-call reward for a call holding `max_per_call` of them already is refused. A rollout whose grader gives
    its reward keeps a final reward from anyone else (`giver`) as a claim and refuses per-call ones."""
    try:
        rollout = await store_rollouts.rollout_taking_rewards(session, rollout_id, project)
    except (NotFound, Conflict, NotYours) as exc:
        return [SpanResult(REJECTED, f"span {span.span_id}: {exc}") for span in spans]
    taken = store_rollouts.taken(rollout)  # a rollout a step took takes no rewards for its calls
    if not store_rollouts.may_reward(rollout, giver):  # the grader's: per-call rewards only from it
        taken = f"rollout {rollout_id!r} takes its rewards from its grader; a span's per-call reward is not kept"
    calls = _RolloutCalls(session, rollout_id)
    held = await _call_rewards(session, rollout_id, max_per_call)
    # Per-call rewards first: a final reward closes the rollout, and the trainer may take it from then on.
    ordered = sorted(spans, key=lambda span: span.reward is not None and span.is_final)
    return [await _store_span(session, rollout_id, span, project, weights, calls, held, taken, giver)
            for span in ordered]


async def _store_span(session: AsyncSession, rollout_id: str, span: SpanFacts, project: str | None,
                      weights: ToolWeights, calls: _RolloutCalls, held: _CallRewards,
                      taken: str | None = None, giver: str = RewardedBy.AGENT) -> SpanResult:
    result = SpanResult(DUPLICATE)
    errors = []
    air = weights.for_span(span)
    if air is not None:
        try:
            if taken is not None:
                raise Conflict(taken)
            call = await calls.target(span, explicit=False)
            if await _insert_air(session, rollout_id, call.id, span, *air):
                result.air.append((air[0], call.policy_version))
        except (NotFound, Conflict) as exc:
            errors.append(str(exc))
    if span.reward_error is not None:
        errors.append(span.reward_error)
    elif span.reward is not None:
        try:
            if span.is_final:
                final = await store_rollouts.post_reward(session, rollout_id, span.reward, metadata=span.key,
                                                         project=project, giver=giver)
                if final.claim:
                    result.claim = final
                else:
                    result.final = final if final.created else None
            elif (span.trace_id, span.span_id) not in held.spans:
                if taken is not None:
                    raise Conflict(taken)
                call = await calls.target(span, explicit=True)
                if held.per_call[call.id] >= held.limit:
                    raise reward_rows.TooManyCallRewards(call.id, held.limit)
                reward_rows.add_call_reward(session, rollout_id, call.id, span.reward,
                                            {**span.key, "name": span.name})
                held.spans.add((span.trace_id, span.span_id))
                held.per_call[call.id] += 1
                result.call_rewards.append(store_rollouts.RewardResult(rollout_id, span.reward, call.id, True))
        except reward_rows.TooManyCallRewards as exc:
            errors.append(f"{exc} (--max-rewards-per-call)")
        except (NotFound, Conflict) as exc:
            errors.append(str(exc))
    if errors:
        result.outcome, result.error = REJECTED, f"span {span.span_id}: " + "; ".join(errors)
    elif result.final is not None:
        result.outcome = REWARDED_FINAL
    elif result.call_rewards:
        result.outcome = REWARDED_CALL
    elif result.claim is not None:
        result.outcome = CLAIMED
    elif result.air:
        result.outcome = AIR
    return result


async def _insert_air(session: AsyncSession, rollout_id: str, call_id: str, span: SpanFacts, reason: str,
                      value: float) -> bool:
    """Whether the automatic reward was stored (False: the call has one for this reason already, from the
    traffic itself or an earlier export of this span)."""
    metadata = {"tool_call_id": span.tool_call_id, "tool": span.tool_name, **span.key}
    return await reward_rows.add_air_once(session, reward_rows.air_row(rollout_id, call_id, value, reason, metadata))


async def _call_rewards(session: AsyncSession, rollout_id: str, limit: int) -> _CallRewards:
    spans, per_call = await reward_rows.call_rewards_held(session, rollout_id)
    return _CallRewards(spans, per_call, limit)


