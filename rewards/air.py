"""Automatic Intermediate Rewards (AIR): per-call rewards read off the OpenAI chat traffic itself.

A call's response may ask for tool calls; a later call's request carries their results as
`{"role": "tool", "tool_call_id": ...}` messages. From that pair we judge each tool call:

    invalid_arguments  arguments are not a JSON object                     (default -0.5)
    unknown_tool       the tool was not among those the request offered     (default -0.5)
    tool_error         the tool's result reports an error                   (default -0.25)
    tool_success       a result came back and reports no error              (default 0.0, i.e. off)

A rule whose weight is 0 is off: zero-valued rewards are never emitted.

Agents that speak a text tool protocol (no native tool calls) get tool_error / tool_success from the
`text_*_patterns` rules instead (rewards/text_tools.py); they are off while no action pattern is set.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The rules are settings (core/air_rules.py); applying them is this module's job. Re-exported: callers of the
# reward functions name the reasons and rules from here.
from core.air_rules import (  # noqa: F401
    AIR_REASONS,
    DEFAULT_ERROR_PATTERNS,
    INVALID_ARGUMENTS,
    TOOL_ERROR,
    TOOL_SUCCESS,
    UNKNOWN_TOOL,
    AirReward,
    AirRules,
)
from core.checks import loads_strict
from core.text import content_text

_ERROR_STATUSES = frozenset({"error", "failed", "failure"})
_EXIT_CODE_KEYS = ("exit_code", "exitCode", "returncode", "return_code")


def find_tool_results(messages: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Map tool_call_id -> result text for every `role: "tool"` message (first one wins)."""
    results: dict[str, str] = {}
    for message in messages or ():
        if not isinstance(message, Mapping) or message.get("role") != "tool":
            continue
        call_id = message.get("tool_call_id")
        if isinstance(call_id, str) and call_id not in results:
            results[call_id] = content_text(message.get("content"))
    return results


def is_tool_error(result_text: str, rules: AirRules | None = None) -> bool:
    """Whether a tool result reports an error.

    A JSON object result is an error if it has a truthy "error", "is_error"/"isError": true,
    "status" in {error, failed, failure}, "success"/"ok": false, or a non-zero exit code key. Then,
    for any result, the error patterns are searched in its text (for JSON: its string values only).
    """
    rules = rules or AirRules()
    try:
        parsed = loads_strict(result_text)
    except ValueError:
        return _matches(result_text, rules)
    if isinstance(parsed, dict) and _structured_error(parsed):
        return True
    return any(_matches(text, rules) for text in _string_leaves(parsed))


def score_text_tool_result(
    result_text: str | None, rules: AirRules | None = None, tool_call_id: str | None = None
) -> list[AirReward]:
    """tool_error or tool_success for one tool result, for agents that speak a text tool protocol."""
    rules = rules or AirRules()
    if not rules.enabled or result_text is None:
        return []
    return rules.reward(TOOL_ERROR if is_tool_error(result_text, rules) else TOOL_SUCCESS, tool_call_id)


def score_tool_calls(
    prev_request: Mapping[str, Any] | None,
    prev_response: Mapping[str, Any] | None,
    later_messages: Sequence[Mapping[str, Any]] | None,
    rules: AirRules | None = None,
) -> list[AirReward]:
    """AIR rewards for the tool calls that `prev_response` (choice 0) asked for.

    A tool call with a malformed call site (invalid_arguments and/or unknown_tool) is judged on that
    alone: its result is almost always an error caused by the same mistake, so it is not penalised
    twice. Otherwise its result, if one of `later_messages` carries it, gives tool_error or
    tool_success. A tool call without a result yet gets no result reward.
    """
    rules = rules or AirRules()
    if not rules.enabled:
        return []
    message = _first_message(prev_response)
    if message is None:
        return []
    offered = _offered_tool_names(prev_request)
    results = find_tool_results(later_messages or ())

    rewards: list[AirReward] = []
    for call in _requested_calls(message):
        faults = []
        if call.is_function and not _is_json_object(call.arguments):
            faults.append(INVALID_ARGUMENTS)
        if call.is_function and offered and call.name not in offered:
            faults.append(UNKNOWN_TOOL)
        if faults:
            for reason in faults:
                rewards.extend(rules.reward(reason, call.tool_call_id))
        elif call.tool_call_id in results:
            rewards.extend(score_text_tool_result(results[call.tool_call_id], rules, call.tool_call_id))
    return rewards


def merge_by_reason(rewards: Iterable[AirReward]) -> list[AirReward]:
    """One reward per reason, summing values, in order of first appearance.

    For storage that keeps at most one automatic reward per (call, reason). The merged reward keeps
    the tool_call_id only if all its parts share it.
    """
    merged: dict[str, AirReward] = {}
    for reward in rewards:
        seen = merged.get(reward.reason)
        if seen is None:
            merged[reward.reason] = reward
        else:
            same_id = seen.tool_call_id if seen.tool_call_id == reward.tool_call_id else None
            merged[reward.reason] = AirReward(seen.value + reward.value, reward.reason, same_id)
    return list(merged.values())


@dataclass(frozen=True)
class _RequestedCall:
    tool_call_id: str | None
    is_function: bool  # only function calls have a name and JSON arguments to check
    name: Any = None
    arguments: Any = None


def _first_message(response: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    if not isinstance(response, Mapping):
        return None
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return None
    message = choices[0].get("message")
    return message if isinstance(message, Mapping) else None


def _requested_calls(message: Mapping[str, Any]) -> list[_RequestedCall]:
    """The calls a response message asks for: its tool_calls, plus a legacy `function_call`."""
    calls = []
    for tool_call in message.get("tool_calls") or ():
        if not isinstance(tool_call, Mapping):
            continue
        call_id = tool_call.get("id") if isinstance(tool_call.get("id"), str) else None
        function = tool_call.get("function")
        if tool_call.get("type", "function") == "function" and isinstance(function, Mapping):
            calls.append(_RequestedCall(call_id, True, function.get("name"), function.get("arguments")))
        else:
            calls.append(_RequestedCall(call_id, False))
    legacy = message.get("function_call")
    if isinstance(legacy, Mapping):
        calls.append(_RequestedCall(None, True, legacy.get("name"), legacy.get("arguments")))
    return calls


def _offered_tool_names(request: Mapping[str, Any] | None) -> frozenset[str]:
    if not isinstance(request, Mapping):
        return frozenset()
    names = set()
    for tool in request.get("tools") or ():
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            names.add(function["name"])
    for function in request.get("functions") or ():  # the legacy form
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            names.add(function["name"])
    return frozenset(names)


def _is_json_object(arguments: Any) -> bool:
    if isinstance(arguments, Mapping):  # some servers hand back parsed arguments
        return True
    if not isinstance(arguments, str):
        return False
    try:
        return isinstance(loads_strict(arguments), dict)
    except (ValueError, RecursionError):  # nested past Python's recursion limit: no object a tool can take
        return False


def _structured_error(result: Mapping[str, Any]) -> bool:
    if result.get("error"):
        return True
    if result.get("is_error") is True or result.get("isError") is True:
        return True
    status = result.get("status")
    if isinstance(status, str) and status.strip().casefold() in _ERROR_STATUSES:
        return True
    if result.get("success") is False or result.get("ok") is False:
        return True
    for key in _EXIT_CODE_KEYS:
        code = result.get(key)
        if isinstance(code, int) and not isinstance(code, bool) and code != 0:
            return True
    return False


def _string_leaves(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _string_leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from _string_leaves(item)


def _matches(text: str, rules: AirRules) -> bool:
    return any(pattern.search(text) for pattern in rules._compiled)
