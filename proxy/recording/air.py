"""Automatic Intermediate Rewards, stored as the writer records calls (inside the same transaction).

Faults of a call's own tool calls (arguments that are not JSON, a tool that was not offered) are known as
soon as the call is recorded; the outcome of its tool calls is known when the next call of the same rollout
and agent carries the tool results (or, for a text tool protocol, the turn that answers its reply). At most
one automatic reward per call and reason is stored, so replays and re-scoring are no-ops.

AIR is a bonus on top of the record, never a condition of it: a call AIR cannot score (a body the rules did not
foresee) or whose rewards the database refuses (the parent call pruned meanwhile) is stored without them, and
the failure is logged and counted in `rlproxy_air_errors_total{stage}`. Only a database that cannot be reached
fails the write, as it would without AIR (the writer then spools the calls)."""
from __future__ import annotations

import logging

from sqlalchemy.exc import DataError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from core.chat_view import chat_view
from core.settings import ProxySettings
from proxy.metrics import ProxyMetrics
from rewards import AirRules, merge_by_reason, score_text_tools, score_tool_calls
from rewards.air import INVALID_ARGUMENTS, UNKNOWN_TOOL
from store import rewards as reward_rows
from store.calls import WrittenCall
from store.models import RewardKind

FAULTS = (INVALID_ARGUMENTS, UNKNOWN_TOOL)

log = logging.getLogger("rlproxy.air")


def air_rules(settings: ProxySettings) -> AirRules:
    """The rules a proxy scores with; ValueError for a text pattern that is invalid or lacks its pair."""
    def patterns(value: str | None) -> tuple[str, ...]:
        return (value,) if value else ()

    return AirRules(enabled=settings.air, invalid_arguments=settings.air_invalid_arguments,
                    unknown_tool=settings.air_unknown_tool, tool_error=settings.air_tool_error,
                    tool_success=settings.air_tool_success, error_patterns=settings.air_error_patterns,
                    text_action_patterns=patterns(settings.air_text_action),
                    text_error_patterns=patterns(settings.air_text_error),
                    text_success_patterns=patterns(settings.air_text_success))


def automatic_rewards(rules: AirRules, metrics: ProxyMetrics):
    async def after_write(session: AsyncSession, written: list[WrittenCall]) -> None:
        rows = []
        for item in written:
            try:
                rows += _score(item, rules)
            except Exception:  # noqa: BLE001 — whatever the rules did not foresee, the call is stored
                metrics.air_errors.labels("score").inc()
                log.exception("AIR could not score call %s (rollout %s); it is stored without automatic rewards",
                              item.record.id, item.record.rollout_id)
        if rows:
            try:
                # a savepoint: rows the database refuses are undone without undoing the calls of this batch
                async with session.begin_nested():
                    await reward_rows.add_air(session, [row for row, _ in rows])
            except (IntegrityError, DataError) as exc:
                metrics.air_errors.labels("store").inc()
                log.error("the database refused %d automatic rewards (%s: %s); their calls are stored without them",
                          len(rows), type(exc).__name__, exc)
                return
            for row, policy in rows:
                metrics.rewards.labels(RewardKind.AIR, row["reason"], "" if policy is None else str(policy)).inc()

    return after_write


def _score(item: WrittenCall, rules: AirRules) -> list:
    """The reward rows one written call brings: faults of its own tool calls, and the outcome of its parent's."""
    record = item.record
    if record.rollout_id is None or record.route == "completions" or not record.request:
        return []
    # Whatever API the calls came through, AIR reads them in chat form (core/chat_view.py).
    request, response = chat_view(record.route, record.request, record.response)
    if request is None:
        return []
    own = [r for r in score_tool_calls(request, response, (), rules) if r.reason in FAULTS]
    rows = [_row(record.rollout_id, record.id, reward, record.policy_version) for reward in merge_by_reason(own)]
    parent = item.parent
    if parent is not None and parent.response:
        parent_request, parent_response = chat_view(parent.route, parent.request, parent.response)
        outcomes = [r for r in score_tool_calls(parent_request, parent_response, request.get("messages"), rules)
                    if r.reason not in FAULTS]
        # agents with a text tool protocol: markers in the reply and in the turn that answers it
        outcomes += score_text_tools(parent_request, parent_response, request.get("messages"), rules)
        rows += [_row(record.rollout_id, parent.id, reward, record.policy_version)
                 for reward in merge_by_reason(outcomes)]
    return rows


def _row(rollout_id: str, call_id: str, reward, policy: int | None):
    return reward_rows.air_row(rollout_id, call_id, reward.value, reward.reason,
                               {"tool_call_id": reward.tool_call_id}), policy
