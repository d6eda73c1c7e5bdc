"""A call sampled otherwise than its recorded log-probs describe is marked, and the trainer does not take those
log-probs as its behaviour policy. The engine's log-probs are raw (before temperature, top-p/top-k, penalties
and grammar masks: proxy/capture.py), so they are the sampling probabilities only when nothing changed them."""
from __future__ import annotations

import anthropic
import openai
import pytest
import requests

from proxy.capture import altered_sampling


@pytest.mark.parametrize("body", [
    {},
    {"temperature": 1.0, "top_p": 1, "top_k": -1, "min_p": 0.0, "presence_penalty": 0, "frequency_penalty": 0.0,
     "repetition_penalty": 1.0, "logit_bias": {}, "response_format": {"type": "text"}, "tool_choice": "auto"},
    {"top_k": 0, "n": 4, "best_of": 4, "tool_choice": "none", "ignore_eos": False, "min_tokens": 0},
    # these change the prompt the template renders (recorded exactly), not how its tokens are drawn
    {"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": False}, "truncate_prompt_tokens": -1},
])
def test_the_neutral_values_leave_the_log_probs_the_sampling_probabilities(body):
    assert altered_sampling(body) is None


@pytest.mark.parametrize("body,named", [
    ({"temperature": 0.7}, "temperature=0.7"),
    ({"temperature": 0}, "temperature=0"),  # greedy: no token was sampled at its probability
    ({"top_p": 0.95}, "top_p=0.95"),
    ({"top_k": 20}, "top_k=20"),
    ({"min_p": 0.05}, "min_p=0.05"),
    ({"presence_penalty": 0.5}, "presence_penalty=0.5"),
    ({"repetition_penalty": 1.1}, "repetition_penalty=1.1"),
    ({"min_tokens": 5}, "min_tokens=5"),
    ({"ignore_eos": True}, "ignore_eos=True"),
    ({"logit_bias": {"50256": -100}}, "logit_bias"),
    ({"structured_outputs": {"regex": "[0-9]+"}}, "structured_outputs"),
    ({"response_format": {"type": "json_object"}}, "response_format=json_object"),
    ({"tool_choice": "required"}, "tool_choice=required"),
    ({"tool_choice": {"type": "function", "function": {"name": "calc"}}}, "tool_choice=named"),
    ({"best_of": 3}, "best_of=3"),
    ({"thinking_token_budget": 1024}, "thinking_token_budget=1024"),  # its end of thinking may be forced
    ({"thinking_token_budget": 0, "reasoning_effort": "high"}, "thinking_token_budget=0"),
])
def test_each_field_that_changes_the_distribution_is_named(body, named):
    assert altered_sampling(body) == named


def recorded(proxy_url: str, rollout_id: str) -> list[str | None]:
    return [call["sampling"] for call in requests.get(f"{proxy_url}/rollouts/{rollout_id}").json()["calls"]]


def test_the_proxy_marks_each_call_by_what_it_was_sampled_with_on_every_wire_format(proxy_url):
    rollout = requests.post(f"{proxy_url}/rollouts", json={"task_id": "sampling"}).json()
    chat = openai.OpenAI(base_url=rollout["base_url"], api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "hi"}]
    chat.chat.completions.create(model="stub-model", messages=messages, temperature=1.0)
    chat.chat.completions.create(model="stub-model", messages=messages, temperature=0.7)
    chat.responses.create(model="stub-model", input="hi", top_p=0.9)
    claude = anthropic.Anthropic(base_url=rollout["base_url"].removesuffix("/v1"), api_key="unused", max_retries=0)
    claude.messages.create(model="stub-model", max_tokens=16, messages=messages)  # Anthropic's default: 1.0
    claude.messages.create(model="stub-model", max_tokens=16, messages=messages,
                           extra_body={"top_k": 20})  # this SDK no longer has the field; earlier ones and agents send it
    assert recorded(proxy_url, rollout["rollout_id"]) == [None, "temperature=0.7", "top_p=0.9", None, "top_k=20"]


PIXEL = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


def test_a_prompt_with_an_image_is_marked_so_its_placeholder_ids_are_not_trained_as_text(proxy_url):
    """A multimodal engine conditioned on the pixels; the trainer would see only the template's placeholder ids."""
    rollout = requests.post(f"{proxy_url}/rollouts", json={"task_id": "media"}).json()
    chat = openai.OpenAI(base_url=rollout["base_url"], api_key="unused", max_retries=0)
    chat.chat.completions.create(model="stub-model", messages=[{"role": "user", "content": [
        {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": PIXEL}}]}])
    chat.chat.completions.create(model="stub-model", messages=[{"role": "user", "content": [
        {"type": "text", "text": "Only text, in parts."}]}])
    claude = anthropic.Anthropic(base_url=rollout["base_url"].removesuffix("/v1"), api_key="unused", max_retries=0)
    claude.messages.create(model="stub-model", max_tokens=16, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PIXEL.split(",")[1]}},
        {"type": "text", "text": "What is this?"}]}])
    assert recorded(proxy_url, rollout["rollout_id"]) == ["media=image_url", None, "media=image_url"]
