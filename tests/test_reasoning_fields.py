"""How much a model thinks, as the agent asked: Anthropic's `thinking` and `output_config.effort`, and the Responses
API's `reasoning.effort` and `truncation`, reach the engine's chat request as vLLM's own routes send them
(proxy/dialects/reasoning.py), through the real SDKs, in front of the stand-in engine that keeps every body it
receives (tests/tenants.py). A thinking budget makes the sampler force the end of thinking, so such a call is
marked as not sampled from its recorded log-probs; an effort only changes the prompt, which is recorded exactly.
Forms the chat request cannot carry are refused by name."""
from __future__ import annotations

import anthropic
import openai
import orjson
import pytest

from testkit.stub_engine import BASE_MODEL

USER = [{"role": "user", "content": "What is 6*7?"}]
REASONING = ("reasoning_effort", "thinking_token_budget", "chat_template_kwargs", "truncate_prompt_tokens")


def engine_request(tenants) -> dict:
    """The one chat request the engine received since the last look, with only its reasoning fields."""
    [(path, raw)] = [(path, raw) for path, raw in tenants.stub.bodies if path != "/v1/models"]
    tenants.stub.bodies.clear()
    assert path == "/v1/chat/completions"
    sent = orjson.loads(raw)
    return {name: sent[name] for name in REASONING if name in sent}


@pytest.fixture
def claude(tenants):
    """An Anthropic client on a fresh rollout of project gamma (the base model); yields (client, rollout id)."""
    rollout = tenants.rollout("gamma")
    tenants.stub.bodies.clear()
    yield tenants.anthropic("gamma", base_url=rollout["base_url"].removesuffix("/v1")), rollout["rollout_id"]


@pytest.fixture
def codex(tenants):
    """An OpenAI client on a fresh rollout of project gamma; yields (client, rollout id)."""
    rollout = tenants.rollout("gamma")
    tenants.stub.bodies.clear()
    yield tenants.openai("gamma", base_url=rollout["base_url"]), rollout["rollout_id"]


@pytest.mark.parametrize("asked, engine, sampling", [
    ({}, {}, None),
    ({"thinking": {"type": "disabled"}}, {"reasoning_effort": "none"}, None),  # Qwen3's template: thinking off
    ({"thinking": {"type": "adaptive"}}, {}, None),  # the model chooses: nothing to pin
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, {"thinking_token_budget": 1024},
     "thinking_token_budget=1024"),  # the end of thinking may be forced: not sampled at its log-probs
    ({"output_config": {"effort": "high"}}, {"reasoning_effort": "high"}, None),
    ({"output_config": {"effort": "high"}, "thinking": {"type": "disabled"}}, {"reasoning_effort": "none"}, None),
    ({"output_config": {"effort": "low"}, "thinking": {"type": "adaptive", "display": "omitted"}},
     {"reasoning_effort": "low"}, None),
    ({"output_config": {"effort": "max"}, "thinking": {"type": "enabled", "budget_tokens": 1500}},
     {"reasoning_effort": "max", "thinking_token_budget": 1500}, "thinking_token_budget=1500"),
])
def test_messages_thinking_and_effort_reach_the_engine_as_vllms_own_route_sends_them(tenants, claude, asked, engine,
                                                                                     sampling):
    client, rollout_id = claude
    message = client.messages.create(model=BASE_MODEL, max_tokens=2048, messages=USER, **asked)

    assert engine_request(tenants) == engine
    [call] = tenants.calls("gamma", rollout_id)
    assert call["sampling"] == sampling
    assert {name: call["request"].get(name) for name in asked} == asked  # what the agent sent, as it sent it
    assert message.content[0].text and message.stop_reason == "end_turn"


def test_a_streamed_message_with_thinking_switched_off_is_sent_and_read_alike(tenants, claude):
    """Claude Code streams, and turns thinking off for models that cannot think."""
    client, rollout_id = claude
    with client.messages.stream(model=BASE_MODEL, max_tokens=64, messages=USER,
                                thinking={"type": "disabled"}) as stream:
        final = stream.get_final_message()

    assert engine_request(tenants) == {"reasoning_effort": "none"}
    assert final.content[0].text and tenants.calls("gamma", rollout_id)[0]["sampling"] is None


def test_the_agents_own_template_kwargs_go_along_with_its_thinking(tenants, claude):
    """CLAUDE_CODE_EXTRA_BODY's `enable_thinking` and `thinking` both reach the engine: its chat route lets the
    template kwargs win over what the effort implies, as vLLM's Messages route does."""
    client, _ = claude
    client.messages.create(model=BASE_MODEL, max_tokens=2048, messages=USER,
                           thinking={"type": "enabled", "budget_tokens": 1024},
                           extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert engine_request(tenants) == {"thinking_token_budget": 1024,
                                       "chat_template_kwargs": {"enable_thinking": False}}


@pytest.mark.parametrize("asked, words", [
    ({"thinking": {"type": "between_tools"}}, "thinking.type: 'between_tools' is not available on this engine"),
    ({"thinking": {"type": "enabled", "budget_tokens": 512}}, "thinking.budget_tokens: expected an integer of at "
                                                              "least 1024"),
    ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens: expected an integer"),
    ({"thinking": {"type": "enabled", "budget_tokens": 4096}}, "thinking.budget_tokens: must be less than max_tokens"),
    ({"thinking": {"type": "adaptive", "display": "verbose"}}, "thinking.display: expected one of"),
    ({"thinking": "on"}, "thinking: expected an object"),
    ({"output_config": {"effort": "minimal"}}, "output_config.effort: expected one of low, medium, high, xhigh, max"),
])
def test_thinking_the_engine_cannot_be_told_is_refused_by_name(tenants, claude, asked, words):
    client, rollout_id = claude
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model=BASE_MODEL, max_tokens=2048, messages=USER, **asked)
    assert refused.value.body["type"] == "error" and words in refused.value.body["error"]["message"]
    assert not [path for path, _ in tenants.stub.bodies if path != "/v1/models"]  # nothing reached the engine
    assert tenants.calls("gamma", rollout_id) == []


@pytest.mark.parametrize("asked, engine", [
    ({}, {}),
    ({"reasoning": {"effort": "none"}}, {"reasoning_effort": "none"}),
    ({"reasoning": {"effort": "high", "summary": "auto"}}, {"reasoning_effort": "high"}),
    ({"reasoning": {"summary": "concise"}}, {}),  # vLLM reads no summary setting for a chat-template model
    ({"truncation": "auto"}, {"truncate_prompt_tokens": -1}),  # cut the prompt's start to fit, as vLLM does
    ({"truncation": "disabled", "reasoning": {"effort": "minimal"}}, {"reasoning_effort": "minimal"}),
])
def test_responses_reasoning_and_truncation_reach_the_engine_as_vllms_own_route_sends_them(tenants, codex, asked,
                                                                                           engine):
    client, rollout_id = codex
    response = client.responses.create(model=BASE_MODEL, input="What is 6*7?", **asked)

    assert engine_request(tenants) == engine
    [call] = tenants.calls("gamma", rollout_id)
    assert call["sampling"] is None and {name: call["request"].get(name) for name in asked} == asked
    assert response.output_text
    assert response.truncation == asked.get("truncation", "disabled")
    assert response.reasoning.effort == asked.get("reasoning", {}).get("effort")


def test_a_streamed_response_carries_its_effort_too(tenants, codex):
    client, _ = codex
    with client.responses.stream(model=BASE_MODEL, input="What is 6*7?", reasoning={"effort": "low"}) as stream:
        final = stream.get_final_response()
    assert engine_request(tenants) == {"reasoning_effort": "low"}
    assert final.output_text and final.reasoning.effort == "low"


@pytest.mark.parametrize("asked, param", [
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"reasoning": "high"}, "reasoning"),
    ({"truncation": "middle"}, "truncation"),
])
def test_responses_reasoning_the_engine_cannot_be_told_is_refused_by_name(tenants, codex, asked, param):
    client, rollout_id = codex
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=BASE_MODEL, input="What is 6*7?", extra_body=asked)
    assert refused.value.body["param"] == param and refused.value.body["type"] == "invalid_request_error"
    assert not [path for path, _ in tenants.stub.bodies if path != "/v1/models"]
    assert tenants.calls("gamma", rollout_id) == []


def test_a_chat_agents_own_thinking_budget_marks_its_call(tenants):
    """vLLM's chat route takes `thinking_token_budget` from chat agents too; their calls are marked alike."""
    rollout = tenants.rollout("gamma")
    client = tenants.openai("gamma", base_url=rollout["base_url"])
    client.chat.completions.create(model=BASE_MODEL, messages=USER, extra_body={"thinking_token_budget": 64})
    client.chat.completions.create(model=BASE_MODEL, messages=USER, reasoning_effort="low")
    assert [c["sampling"] for c in tenants.calls("gamma", rollout["rollout_id"])] == ["thinking_token_budget=64",
                                                                                       None]
