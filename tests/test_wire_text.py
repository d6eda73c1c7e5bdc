"""Text and conversations read out of the three wire formats, each by one function on the ground floor:
`core.text.content_text` (a message's content as text) and `core.chat_view.chat_view` (a recorded call in chat
form), which AIR, the judge and the dialects all use."""
from __future__ import annotations

import pytest

from core.chat_view import chat_view
from core.text import content_text
from rewards.judge import RecordedCall, trajectory_text

IMAGE_URL = "https://example.com/cat.png"


@pytest.mark.parametrize(("content", "text"), [
    # a plain string, and nothing at all, in every format
    ("The tests pass.", "The tests pass."),
    (None, ""),
    # Chat Completions parts
    ([{"type": "text", "text": "Look:"}, {"type": "image_url", "image_url": {"url": IMAGE_URL}},
      {"type": "text", "text": "a cat."}], "Look:\na cat."),
    # Responses input and output parts
    ([{"type": "input_text", "text": "Look:"}, {"type": "input_image", "image_url": IMAGE_URL}], "Look:"),
    ([{"type": "output_text", "text": "A cat.", "annotations": []}], "A cat."),
    # Messages blocks (a tool result's content is a string or a list of such blocks)
    ([{"type": "text", "text": "exit 1"}, {"type": "image", "source": {"type": "url", "url": IMAGE_URL}},
      {"type": "text", "text": "make: *** Error 2"}], "exit 1\nmake: *** Error 2"),
    # a tool's structured result, written as JSON
    ({"exit_code": 1}, '{"exit_code": 1}'),
])
def test_content_reads_as_text_in_every_wire_format(content, text):
    assert content_text(content) == text


def test_the_parts_may_be_joined_without_a_separator():
    blocks = [{"type": "text", "text": "4"}, {"type": "text", "text": "2"}]
    assert content_text(blocks, separator="") == "42"


TOOLS_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
ARGUMENTS = '{"city": "Oslo"}'
# One exchange (instructions, a question, a tool call, its result, the answer) as each API records it.
EXCHANGE = {
    "chat": (
        {"model": "m", "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": ARGUMENTS}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "Sunny"}],
         "tools": [{"type": "function", "function": {"name": "weather", "parameters": TOOLS_SCHEMA}}]},
        {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Sunny in Oslo."}}]}),
    "responses": (
        {"model": "m", "instructions": "Be brief.", "input": [
            {"role": "user", "content": "Weather in Oslo?"},
            {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": ARGUMENTS},
            {"type": "function_call_output", "call_id": "c1", "output": "Sunny"}],
         "tools": [{"type": "function", "name": "weather", "parameters": TOOLS_SCHEMA}]},
        {"output": [{"type": "message", "role": "assistant",
                     "content": [{"type": "output_text", "text": "Sunny in Oslo.", "annotations": []}]}]}),
    "messages": (
        {"model": "m", "max_tokens": 64, "system": "Be brief.", "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "weather",
                                               "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "Sunny"}]}],
         "tools": [{"name": "weather", "input_schema": TOOLS_SCHEMA}]},
        {"content": [{"type": "text", "text": "Sunny in Oslo."}]}),
}


def turns(messages: list[dict]) -> list[tuple]:
    return [(m["role"], content_text(m.get("content")), [c["function"] for c in m.get("tool_calls") or ()],
             m.get("tool_call_id")) for m in messages]


@pytest.mark.parametrize("route", ["responses", "messages"])
def test_a_recorded_call_reads_as_the_same_chat_in_every_wire_format(route):
    chat_request, chat_response = chat_view("chat", *EXCHANGE["chat"])
    request, response = chat_view(route, *EXCHANGE[route])
    assert turns(request["messages"]) == turns(chat_request["messages"])
    assert [tool["function"]["name"] for tool in request["tools"]] == ["weather"]
    assert response["choices"][0]["message"]["content"] == chat_response["choices"][0]["message"]["content"]


def test_the_judge_reads_one_exchange_alike_whatever_the_api():
    texts = {route: trajectory_text([RecordedCall(route, *EXCHANGE[route])]) for route in EXCHANGE}
    assert texts["chat"] == ('[system] Be brief.\n[user] Weather in Oslo?\n[assistant] call weather({"city": "Oslo"})'
                             "\n[tool] Sunny\n[assistant] Sunny in Oslo.")
    assert texts["responses"] == texts["chat"] and texts["messages"] == texts["chat"]
