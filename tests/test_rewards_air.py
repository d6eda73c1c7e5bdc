"""Automatic intermediate rewards as pure functions: what a tool call, its arguments and its result earn."""
from __future__ import annotations

import math

import pytest

from rewards.air import (
    AirReward,
    AirRules,
    find_tool_results,
    is_tool_error,
    merge_by_reason,
    score_text_tool_result,
    score_tool_calls,
)

EPS = 1e-6



def chat_request(*tool_names: str) -> dict:
    return {
        "model": "policy",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": n, "parameters": {}}} for n in tool_names],
    }


def tool_call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def chat_response(*tool_calls: dict) -> dict:
    message = {"role": "assistant", "content": None, "tool_calls": list(tool_calls)}
    return {"id": "chatcmpl-1", "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}


def tool_result(call_id: str, content) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def test_a_good_tool_call_earns_nothing_by_default():
    request = chat_request("search")
    response = chat_response(tool_call("c1", "search", '{"q": "weather"}'))
    later = [tool_result("c1", "Sunny, 21C")]
    assert score_tool_calls(request, response, later, AirRules()) == []


def test_tool_success_is_emitted_once_it_has_a_weight():
    request = chat_request("search")
    response = chat_response(tool_call("c1", "search", '{"q": "weather"}'))
    later = [tool_result("c1", "Sunny, 21C")]
    assert score_tool_calls(request, response, later, AirRules(tool_success=0.1)) == [
        AirReward(0.1, "tool_success", "c1")
    ]


@pytest.mark.parametrize("arguments", ["{not json", "[1, 2]", '"text"', "", '{"x": NaN}'])
def test_arguments_that_are_not_a_json_object_are_invalid(arguments):
    response = chat_response(tool_call("c1", "search", arguments))
    assert score_tool_calls(chat_request("search"), response, [], AirRules()) == [
        AirReward(-0.5, "invalid_arguments", "c1")
    ]


def test_unknown_tool_is_only_judged_when_tools_were_offered():
    response = chat_response(tool_call("c1", "delete_everything", "{}"))
    assert score_tool_calls(chat_request("search"), response, [], AirRules()) == [
        AirReward(-0.5, "unknown_tool", "c1")
    ]
    assert score_tool_calls({"messages": []}, response, [], AirRules()) == []


def test_a_malformed_call_is_not_penalised_again_for_its_error_result():
    response = chat_response(tool_call("c1", "nope", "{oops"))
    later = [tool_result("c1", "Error: unknown tool 'nope'")]
    assert score_tool_calls(chat_request("search"), response, later, AirRules()) == [
        AirReward(-0.5, "invalid_arguments", "c1"),
        AirReward(-0.5, "unknown_tool", "c1"),
    ]


def test_each_tool_call_is_judged_on_its_own_result():
    response = chat_response(
        tool_call("c1", "shell", '{"cmd": "ls"}'),
        tool_call("c2", "shell", '{"cmd": "make"}'),
        tool_call("c3", "shell", '{"cmd": "pwd"}'),  # no result yet: nothing to judge
    )
    later = [
        {"role": "assistant", "content": "Running."},
        tool_result("c1", "README.md\nsrc"),
        tool_result("c2", [{"type": "text", "text": "make: *** [all] Error 2"}]),
    ]
    rules = AirRules(tool_success=0.05)
    assert score_tool_calls(chat_request("shell"), response, later, rules) == [
        AirReward(0.05, "tool_success", "c1"),
        AirReward(-0.25, "tool_error", "c2"),
    ]


def test_legacy_function_call_is_checked_without_an_id():
    request = {"messages": [], "functions": [{"name": "search"}]}
    message = {"role": "assistant", "function_call": {"name": "search", "arguments": "{"}}
    response = {"choices": [{"message": message}]}
    assert score_tool_calls(request, response, [], AirRules()) == [AirReward(-0.5, "invalid_arguments", None)]


def test_responses_without_tool_calls_or_with_air_disabled_give_nothing():
    plain = {"choices": [{"message": {"role": "assistant", "content": "Hello"}}]}
    assert score_tool_calls(chat_request("search"), plain, [], AirRules()) == []
    assert score_tool_calls(chat_request("search"), {"error": "upstream down"}, [], AirRules()) == []
    assert score_tool_calls(None, None, None, AirRules()) == []
    bad = chat_response(tool_call("c1", "nope", "{oops"))
    assert score_tool_calls(chat_request("search"), bad, [], AirRules(enabled=False)) == []


def test_a_zero_weight_turns_a_rule_off():
    response = chat_response(tool_call("c1", "search", "{oops"))
    assert score_tool_calls(chat_request("search"), response, [], AirRules(invalid_arguments=0.0)) == []


@pytest.mark.parametrize(
    "text",
    [
        "Error: file not found",
        "ERROR while connecting",
        "Traceback (most recent call last):\n  ...",
        "ValueError: invalid literal for int()",
        "Command failed",
        "3 errors, 1 warning",
        "Process exited with exit code 2",
        "exit status: 1",
        "subprocess returned non-zero exit status 1",
        "bash: foo: command not found",
        "cat: x.txt: No such file or directory",
        "fatal: not a git repository",
        '{"error": "rate limited"}',
        '{"is_error": true, "content": "x"}',
        '{"status": "Error", "detail": "bad"}',
        '{"exit_code": 1, "stdout": ""}',
        '{"result": {"log": "Traceback ..."}}',
    ],
)
def test_tool_error_patterns_catch_common_failures(text):
    assert is_tool_error(text)


@pytest.mark.parametrize(
    "text",
    [
        "The terrorism report was published.",
        "Found 0 errors in 12 files",
        "No errors found",
        "error-free build",
        "errors: 0",
        "42 passed, 0 failed",
        "Process exited with exit code 0",
        "DeprecationWarning: use x instead",
        "the error_code field is documented below",
        '{"error": null, "result": "ok"}',
        '{"status": "ok", "error": ""}',
        "Sunny, 21C",
    ],
)
def test_tool_error_patterns_avoid_false_positives(text):
    assert not is_tool_error(text)


def test_error_patterns_are_configurable():
    rules = AirRules(error_patterns=(r"\bboom\b",))
    assert is_tool_error("it went boom", rules)
    assert not is_tool_error("Traceback (most recent call last)", rules)


def test_text_protocol_results_are_scored_with_the_same_check():
    assert score_text_tool_result("Error: timeout", AirRules()) == [AirReward(-0.25, "tool_error", None)]
    assert score_text_tool_result("42", AirRules()) == []
    assert score_text_tool_result("42", AirRules(tool_success=0.2)) == [AirReward(0.2, "tool_success", None)]
    assert score_text_tool_result(None, AirRules(tool_success=0.2)) == []


def test_find_tool_results_maps_ids_to_text():
    messages = [
        {"role": "user", "content": "Error: not a tool message"},
        tool_result("a", "plain"),
        tool_result(
            "b",
            [
                {"type": "text", "text": "part 1"},
                {"type": "image_url", "image_url": {"url": "data:,"}},
                {"type": "text", "text": "part 2"},
            ],
        ),
        tool_result("c", None),
        tool_result("a", "a repeat is ignored"),
    ]
    assert find_tool_results(messages) == {"a": "plain", "b": "part 1\npart 2", "c": ""}


def test_merge_by_reason_sums_for_one_reward_per_call_and_reason():
    per_tool_call = [
        AirReward(-0.25, "tool_error", "c1"),
        AirReward(0.1, "tool_success", "c2"),
        AirReward(-0.25, "tool_error", "c3"),
    ]
    assert merge_by_reason(per_tool_call) == [
        AirReward(-0.5, "tool_error", None),
        AirReward(0.1, "tool_success", "c2"),
    ]


def test_air_rules_are_validated():
    with pytest.raises(ValueError, match="tool_error"):
        AirRules(tool_error=math.nan)
    with pytest.raises(ValueError, match="invalid AIR error pattern"):
        AirRules(error_patterns=("(unclosed",))
    with pytest.raises(ValueError, match="not one string"):
        AirRules(error_patterns=r"\berror\b")


# --- scorers ----------------------------------------------------------------------------------------
