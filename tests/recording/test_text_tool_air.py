"""AIR for text tool protocols (rewards/text_tools.py): the pure rules, the settings that switch them on,
and `rlproxy serve` (a real process, configured by flags and environment) in front of the stub engine with
the real `openai` SDK, storing the reward in real Postgres."""
from __future__ import annotations

import openai
import pytest
import requests
from click.testing import CliRunner

from core.chat_view import chat_view
from core.settings import ProxySettings
from demo.agent import AIR_TEXT_ACTION, AIR_TEXT_ERROR, parse_action, run_tool
from proxy.recording.air import air_rules
from rewards.air import AirReward, AirRules
from rewards.text_tools import score_text_tools, text_tool_outcome
from tests.support import free_port, proxy_command, running

DEMO_RULES = AirRules(text_action_patterns=(AIR_TEXT_ACTION,), text_error_patterns=(AIR_TEXT_ERROR,))
RULES = AirRules(tool_success=0.1, text_action_patterns=(r"\bCALC:",), text_error_patterns=("ERROR:",),
                 text_success_patterns=("RESULT:",))
QUESTION = [{"role": "system", "content": "Use CALC: <expression>."},
            {"role": "user", "content": "What is 1/0?"}]


def reply(text, **extra) -> dict:
    message = {"role": "assistant", "content": text, **extra}
    return {"id": "chatcmpl-1", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}


def exchange(reply_text: str, answer: str, role: str = "user") -> list[dict]:
    """The later call's messages: the earlier call's, its reply verbatim, then the turn that answers it."""
    return [*QUESTION, {"role": "assistant", "content": reply_text}, {"role": role, "content": answer}]


def score(reply_text: str, later: list[dict], rules: AirRules = RULES) -> list[AirReward]:
    return score_text_tools({"messages": QUESTION}, reply(reply_text), later, rules)


# --- the pure rules -------------------------------------------------------------------------------


def test_an_error_turn_after_a_tool_action_is_a_tool_error_for_the_reply():
    assert score("CALC: 1 / 0", exchange("CALC: 1 / 0", "ERROR: division by zero")) == [
        AirReward(-0.25, "tool_error", None)
    ]
    # the native rule's weight, and its on/off switch
    assert score("CALC: 1 / 0", exchange("CALC: 1 / 0", "ERROR: x"), AirRules(
        tool_error=-1.0, text_action_patterns=("CALC:",), text_error_patterns=("ERROR:",))) == [
        AirReward(-1.0, "tool_error", None)
    ]
    disabled = AirRules(enabled=False, text_action_patterns=("CALC:",), text_error_patterns=("ERROR:",))
    assert score("CALC: 1 / 0", exchange("CALC: 1 / 0", "ERROR: x"), disabled) == []


def test_a_success_turn_gives_tool_success_only_when_it_has_a_weight():
    assert score("CALC: 6 * 7", exchange("CALC: 6 * 7", "RESULT: 42")) == [
        AirReward(0.1, "tool_success", None)
    ]
    zero = AirRules(text_action_patterns=("CALC:",), text_error_patterns=("ERROR:",),
                    text_success_patterns=("RESULT:",))
    assert score("CALC: 6 * 7", exchange("CALC: 6 * 7", "RESULT: 42"), zero) == []


def test_a_tool_turn_answers_too_and_leading_whitespace_and_content_parts_are_read():
    assert score("CALC: 1/0", exchange("CALC: 1/0", "ERROR: x", role="tool"))[0].reason == "tool_error"
    assert score("CALC: 1/0", exchange("CALC: 1/0", "\n  ERROR: x"))[0].reason == "tool_error"
    parts = exchange("CALC: 1/0", "")
    parts[-1]["content"] = [{"type": "text", "text": "ERROR: x"}]
    parts[-2]["content"] = [{"type": "text", "text": "CALC: 1/0"}]
    assert score("CALC: 1/0", parts)[0].reason == "tool_error"


@pytest.mark.parametrize("answer", [
    "Please reply with CALC: or ANSWER:",  # no marker at all
    "The calculator said ERROR: division by zero",  # the marker, but not at the start
    "error: division by zero",  # patterns are case-sensitive unless they say (?i)
    "RESULTS ERROR: x",
])
def test_a_turn_without_a_marker_at_its_start_gives_nothing(answer):
    assert score("CALC: 1 / 0", exchange("CALC: 1 / 0", answer)) == []


def test_a_reply_without_an_action_gives_nothing_whatever_follows():
    assert score("ANSWER: 7", exchange("ANSWER: 7", "ERROR: no tool was called")) == []
    assert score("", exchange("", "ERROR: empty")) == []


def test_the_answer_must_follow_the_reply_itself_right_after_the_earlier_calls_messages():
    # outer whitespace of the reply as the agent sent it back does not matter
    assert score("CALC: 1/0\n", exchange("  CALC: 1/0", "ERROR: x"))[0].reason == "tool_error"
    # the agent rewrote the reply: not judged
    assert score("CALC: 1 / 0 = 5", exchange("CALC: 1 / 0", "ERROR: x")) == []
    # another turn between the reply and the answer
    later = exchange("CALC: 1/0", "ERROR: x")
    later.insert(-1, {"role": "assistant", "content": "Thinking."})
    assert score("CALC: 1/0", later) == []
    # no answer yet, or an assistant turn last
    assert score("CALC: 1/0", exchange("CALC: 1/0", "ERROR: x")[:-1]) == []
    # a retry of the later call whose own reply repeated the action: its parent's messages already hold the
    # answered turn, so the repeated reply is not the one that was answered
    answered = exchange("CALC: 1/0", "ERROR: x")
    assert score_text_tools({"messages": answered}, reply("CALC: 1/0"), answered, RULES) == []
    # history dropped (a sliding window): the reply no longer stands right after the earlier messages
    assert score("CALC: 1/0", exchange("CALC: 1/0", "ERROR: x")[1:]) == []


def test_a_reply_with_native_tool_calls_is_left_to_the_native_rules():
    call = {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": "{}"}}
    response = reply("CALC: 1/0", tool_calls=[call])
    assert score_text_tools({"messages": QUESTION}, response, exchange("CALC: 1/0", "ERROR: x"), RULES) == []


def test_the_rules_are_off_without_an_action_pattern_and_validated():
    assert score("CALC: 1 / 0", exchange("CALC: 1 / 0", "ERROR: x"), AirRules()) == []
    assert text_tool_outcome("CALC: 1", exchange("CALC: 1", "ERROR: x"), AirRules()) is None
    with pytest.raises(ValueError, match="need text_error_patterns or text_success_patterns"):
        AirRules(text_action_patterns=("CALC:",))
    with pytest.raises(ValueError, match="need text_action_patterns"):
        AirRules(text_error_patterns=("ERROR:",))
    with pytest.raises(ValueError, match="invalid AIR text action pattern"):
        AirRules(text_action_patterns=("(",), text_error_patterns=("ERROR:",))
    with pytest.raises(ValueError, match="not one string"):
        AirRules(text_action_patterns="CALC:", text_error_patterns=("ERROR:",))
    # the existing message for the native error patterns is unchanged
    with pytest.raises(ValueError, match="invalid AIR error pattern"):
        AirRules(error_patterns=("(unclosed",))


def test_action_patterns_are_searched_line_by_line():
    rules = AirRules(text_action_patterns=(r"^CALC:",), text_error_patterns=("ERROR:",))
    assert score("Let me compute.\nCALC: 1/0", exchange("Let me compute.\nCALC: 1/0", "ERROR: x"), rules)
    assert score("I will not CALC: 1/0", exchange("I will not CALC: 1/0", "ERROR: x"), rules) == []


def test_messages_and_responses_calls_are_read_in_chat_form():
    question = [{"role": "user", "content": "What is 1/0?"}]
    written = {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "CALC: 1/0"}]}
    anthropic = chat_view("messages", {"model": "m", "max_tokens": 8, "messages": question}, written)
    later, _ = chat_view("messages", {"model": "m", "max_tokens": 8, "messages": [
        *question, {"role": "assistant", "content": [{"type": "text", "text": "CALC: 1/0"}]},
        {"role": "user", "content": [{"type": "text", "text": "ERROR: division by zero"}]}]}, None)
    assert score_text_tools(*anthropic, later["messages"], RULES) == [AirReward(-0.25, "tool_error", None)]
    responses = chat_view("responses", {"model": "m", "input": "What is 1/0?"}, {"output": [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "CALC: 1/0"}]}]})
    later, _ = chat_view("responses", {"model": "m", "input": [
        {"role": "user", "content": "What is 1/0?"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "CALC: 1/0"}]},
        {"role": "user", "content": "ERROR: division by zero"}]}, None)
    assert score_text_tools(*responses, later["messages"], RULES) == [AirReward(-0.25, "tool_error", None)]


# --- the demo agent's markers ------------------------------------------------------------------------


@pytest.mark.parametrize("text, kind, arg", [
    ("CALC: 1 / 0", "calc", "1 / 0"),
    ("calc: 12 * 0 / 0", "calc", "12 * 0 / 0"),  # the agent reads actions in any case
    ("Sure.\nCALC: 98 * (", "calc", "98 * ("),
    ("LOOKUP: blue whale", "lookup", "blue whale"),  # a lookup in a calc task: ERROR: unknown tool
])
def test_the_demo_markers_catch_the_demo_agents_failed_tool_calls(text, kind, arg):
    action = parse_action(text)
    assert (action.kind, action.arg) == (kind, arg)
    answer = run_tool(kind, arg) if kind == "calc" else f"ERROR: unknown tool {kind.upper()}; use CALC"
    assert answer.startswith("ERROR:")
    assert score(text, exchange(text, answer), DEMO_RULES) == [AirReward(-0.25, "tool_error", None)]


def test_the_demo_markers_ignore_answers_results_and_reminders():
    assert score("CALC: 6 * 7", exchange("CALC: 6 * 7", run_tool("calc", "6 * 7")), DEMO_RULES) == []
    assert score("ANSWER: 42", exchange("ANSWER: 42", "ERROR: x"), DEMO_RULES) == []
    reminder = "Reply with one line: CALC: <expression> or ANSWER: <number>"
    assert score("I think so", exchange("I think so", reminder), DEMO_RULES) == []


def test_the_demos_proxy_scores_a_failed_calc_of_the_demo_agent(stub_url, database_url, tmp_path, monkeypatch):
    """The proxy exactly as `rlproxy demo` starts it (Demo._start_proxy), in front of the stub engine, but for
    taking the stub's controls as request fields."""
    import asyncio
    import functools

    import aiohttp

    from demo import run
    from demo.run import AGENT, Demo, DemoSettings
    from testkit.stub_engine import STUB_CONTROLS

    monkeypatch.setattr(run, "ProxySettings", functools.partial(ProxySettings, allow_request_fields=STUB_CONTROLS))

    async def episode() -> tuple[dict, str]:
        demo = Demo(DemoSettings(database_url=database_url, workdir=tmp_path, proxy_port=free_port()))
        runner = await demo._start_proxy(stub_url, "stub-model")
        proxy = f"http://127.0.0.1:{demo.settings.proxy_port}"
        try:
            async with aiohttp.ClientSession() as http:
                async with http.post(f"{proxy}/rollouts", json={"agent": AGENT}) as response:
                    created = await response.json()
                client = openai.AsyncOpenAI(base_url=created["base_url"], api_key="demo", max_retries=0)
                messages = list(QUESTION)
                first = await client.chat.completions.create(model="stub-model", messages=messages,
                                                             extra_body={"stub_reply": "CALC: 98 * ("})
                text = first.choices[0].message.content
                action = parse_action(text)
                answer = run_tool(action.kind, action.arg)  # what the demo agent answers
                messages += [{"role": "assistant", "content": text}, {"role": "user", "content": answer}]
                await client.chat.completions.create(model="stub-model", messages=messages)
                await client.close()
                async with http.get(f"{proxy}/rollouts/{created['rollout_id']}") as response:
                    return await response.json(), answer
        finally:
            await runner.cleanup()

    data, answer = asyncio.run(episode())
    assert answer.startswith("ERROR:")
    assert air_of(data) == [(data["calls"][0]["call_id"], "tool_error", -0.25)]


# --- settings ---------------------------------------------------------------------------------------


def test_proxy_settings_build_the_text_rules():
    rules = air_rules(ProxySettings(air_text_action="CALC:", air_text_error="ERROR:", air_tool_success=0.2))
    assert rules.text_action_patterns == ("CALC:",) and rules.text_error_patterns == ("ERROR:",)
    assert rules.text_success_patterns == () and rules.tool_success == 0.2
    off = air_rules(ProxySettings())
    assert off.enabled and off.text_action_patterns == () and off.tool_success == 0.0
    assert not air_rules(ProxySettings(air=False, air_text_action="CALC:", air_text_error="ERROR:")).enabled


def test_serve_refuses_incomplete_or_invalid_text_rules_before_starting():
    from rlproxy.cli import main

    runner = CliRunner()
    result = runner.invoke(main, ["serve", "--upstream", "http://127.0.0.1:9", "--air-text-action", "CALC:"])
    assert result.exit_code == 2 and "need text_error_patterns" in result.output
    result = runner.invoke(main, ["serve", "--upstream", "http://127.0.0.1:9", "--air-text-error", "ERROR:"],
                           env={"RLPROXY_AIR_TEXT_ACTION": "("})
    assert result.exit_code == 2 and "invalid AIR text action pattern" in result.output


# --- end to end: rlproxy serve, the stub engine, the openai SDK, Postgres ----------------------------


@pytest.fixture(scope="module")
def text_air_proxy(stub_url, database_url, run_dir):
    """`rlproxy serve` with text rules: action and error by flag, success and its weight by environment."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    spool = str(run_dir / "text-air-spool.jsonl")
    args = proxy_command(port, [stub_url], database_url, "--spool-path", spool,
                         "--air-text-action", r"\bCALC:", "--air-text-error", "ERROR:")
    env = {"RLPROXY_AIR_TEXT_SUCCESS": "RESULT:", "RLPROXY_AIR_TOOL_SUCCESS": "0.1"}
    with running(args, url + "/healthz", env=env, log_path=run_dir / "text-air-proxy.log"):
        yield url


def run_exchange(proxy_url: str, action: str | None, answer: str, *, retry: bool = False) -> tuple[dict, str]:
    """Two calls of one rollout: the stub writes `action` (or its own words), the agent answers it with
    `answer`; returns the rollout as recorded and the first reply."""
    created = requests.post(f"{proxy_url}/rollouts", json={"agent": "calc"})
    assert created.status_code == 201, created.text
    client = openai.OpenAI(base_url=created.json()["base_url"], api_key="unused")
    messages = list(QUESTION)
    first = client.chat.completions.create(model="stub-model", messages=messages,
                                           extra_body={"stub_reply": action} if action else None)
    text = first.choices[0].message.content
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": answer}]
    # the second reply repeats the action: a retry of that call must not score it
    client.chat.completions.create(model="stub-model", messages=messages,
                                   extra_body={"stub_reply": action} if action else None)
    if retry:
        client.chat.completions.create(model="stub-model", messages=messages,
                                       extra_body={"stub_reply": action} if action else None)
    data = requests.get(f"{proxy_url}/rollouts/{created.json()['rollout_id']}").json()
    return data, text


def air_of(data: dict) -> list[tuple[str, str, float]]:
    return [(r["call_id"], r["reason"], r["value"]) for r in data["rewards"] if r["kind"] == "air"]


def test_a_text_tool_error_is_stored_once_on_the_call_that_wrote_the_action(text_air_proxy):
    data, text = run_exchange(text_air_proxy, "CALC: 1 / 0", "ERROR: division by zero", retry=True)
    assert text == "CALC: 1 / 0"  # the stub wrote it; AIR reads the recorded response
    assert data["calls"][0]["response"]["choices"][0]["message"]["content"] == "CALC: 1 / 0"
    assert len(data["calls"]) == 3
    assert air_of(data) == [(data["calls"][0]["call_id"], "tool_error", -0.25)]
    metrics = requests.get(f"{text_air_proxy}/metrics").text
    assert 'rlproxy_rewards_total{kind="air",policy="0",reason="tool_error"}' in metrics


def test_a_text_tool_success_is_stored_with_the_configured_weight(text_air_proxy):
    data, _ = run_exchange(text_air_proxy, "CALC: 6 * 7", "RESULT: 42")
    assert air_of(data) == [(data["calls"][0]["call_id"], "tool_success", 0.1)]


def test_nothing_is_stored_without_the_markers(text_air_proxy):
    data, _ = run_exchange(text_air_proxy, "CALC: 1 / 0", "Please answer with ANSWER: <number>")
    assert air_of(data) == []
    data, text = run_exchange(text_air_proxy, None, "ERROR: division by zero")  # the stub's own words
    assert "CALC:" not in text and air_of(data) == []


def test_nothing_is_stored_when_the_rules_are_off(proxy_url):
    data, _ = run_exchange(proxy_url, "CALC: 1 / 0", "ERROR: division by zero")
    assert len(data["calls"]) == 2 and air_of(data) == []
