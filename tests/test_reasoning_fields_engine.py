"""Thinking settings against the real engine: for the same greedy request, an agent gets through the proxy what
vLLM's own `/v1/messages` and `/v1/responses` give it (the same answer, or the same refusal), for each form of
`thinking`, `output_config.effort` and `reasoning.effort` (proxy/dialects/reasoning.py). The bundled model's
template reads no effort and the engine runs without a reasoning parser, so a thinking budget is refused there
as it is directly: the point is that the proxy neither drops the setting nor fails where the engine serves."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest
import requests

from tests.engine_dialects import GREEDY, QUESTION, anthropic_client, new_rollout, serving_proxy

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def proxy(engine_url: str, database_url: str, run_dir: Path) -> Iterator[str]:
    with serving_proxy(engine_url, database_url, run_dir, "proxy-reasoning") as url:
        yield url


@pytest.mark.parametrize("asked", [
    {"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}},  # what Claude Code 2.1 sends
    {"thinking": {"type": "disabled"}},
    {"thinking": {"type": "enabled", "budget_tokens": 1024}},
], ids=["adaptive-high", "disabled", "budget"])
def test_messages_thinking_gets_what_the_engines_own_route_gives(proxy, engine_url, engine_model, asked):
    body = {"model": engine_model, "max_tokens": 1100, "messages": [{"role": "user", "content": QUESTION}], **asked}
    direct = requests.post(f"{engine_url}/v1/messages", json={**body, **GREEDY}, timeout=180)
    rollout_id, client = anthropic_client(proxy)

    if direct.status_code != 200:
        with pytest.raises(anthropic.APIStatusError) as refused:
            client.messages.create(**body, extra_body=GREEDY)  # this SDK no longer names `temperature`
        assert refused.value.status_code == direct.status_code
        assert refused.value.body["error"]["message"] == direct.json()["error"]["message"]
        return
    message = client.messages.create(**body, extra_body=GREEDY)
    assert [block.text for block in message.content] == [b["text"] for b in direct.json()["content"]]
    assert message.usage.input_tokens == direct.json()["usage"]["input_tokens"]
    [call] = requests.get(f"{proxy}/rollouts/{rollout_id}", timeout=30).json()["calls"]
    assert len(call["prompt_token_ids"]) == message.usage.input_tokens and call["sampling"] == "temperature=0"


@pytest.mark.parametrize("effort", ["none", "high"])
def test_responses_effort_gets_what_the_engines_own_route_gives(proxy, engine_url, engine_model, effort):
    body = {"model": engine_model, "input": QUESTION, "max_output_tokens": 16, **GREEDY,
            "reasoning": {"effort": effort}}
    direct = requests.post(f"{engine_url}/v1/responses", json=body, timeout=180)
    assert direct.status_code == 200, direct.text
    _, base_url = new_rollout(proxy)
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=180)

    response = client.responses.create(**body)

    texts = [part["text"] for item in direct.json()["output"] if item["type"] == "message"
             for part in item["content"]]
    assert response.output_text == "".join(texts) and response.reasoning.effort == effort
    assert response.usage.input_tokens == direct.json()["usage"]["input_tokens"]
