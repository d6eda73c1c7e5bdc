"""What the Responses and Messages tests against the real engine share: the proxy in front of it, the
SDK clients, the engine's native routes as the reference, and the checks on recorded ids (the
method: tests/test_engine_responses.py's docstring)."""
from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import requests

from tests.support import running_proxy, wait_http
from tests.engine_reads import EOS, detokenize, without_eos

# This `anthropic` SDK has no sampling parameters on `messages.create`/`stream`: agents send them as extra body
# fields, which reach the request body as they are (and the proxy and vLLM both read them).
GREEDY = {"temperature": 0}
QUESTION = "What is the capital of France? Answer in one word."  # the model ends its turn in 8 tokens
TOOL_SYSTEM = ("You can use a calculator. To call it, answer with exactly\n<tool_call>\n"
               '{"name": "calculate", "arguments": {"expression": "2+2"}}\n</tool_call>')
CALCULATOR_SCHEMA = {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}
RESPONSES_TOOL = {"type": "function", "name": "calculate", "description": "Evaluate an arithmetic expression.",
                  "parameters": CALCULATOR_SCHEMA}
MESSAGES_TOOL = {"name": "calculate", "description": "Evaluate an arithmetic expression.",
                 "input_schema": CALCULATOR_SCHEMA}
TOOL_MAX_TOKENS = 40  # a forced call takes 31 tokens, EOS included
INJECTED = ('"token_ids"', '"prompt_token_ids"', '"logprob"', '"input_messages"', '"output_messages"')


# -- helpers ------------------------------------------------------------------------------------------
@contextlib.contextmanager
def serving_proxy(engine_url: str, database_url: str, run_dir: Path, name: str) -> Iterator[str]:
    """`rlproxy serve` in front of the shared real engine, ready."""
    with running_proxy([engine_url], database_url, run_dir, name) as url:
        wait_http(url + "/readyz", timeout=60)
        yield url


def new_rollout(proxy: str) -> tuple[str, str]:
    """A fresh rollout: its id and the base URL an agent is given (ends in /v1)."""
    response = requests.post(f"{proxy}/rollouts", json={"task_id": "dialects"})
    assert response.status_code == 201, response.text
    return response.json()["rollout_id"], response.json()["base_url"]


def openai_client(proxy: str) -> tuple[str, openai.OpenAI]:
    rollout_id, base_url = new_rollout(proxy)
    # No retries: a retried request would be a second recorded call.
    return rollout_id, openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=180)


def anthropic_client(proxy: str) -> tuple[str, anthropic.Anthropic]:
    rollout_id, base_url = new_rollout(proxy)
    # The Anthropic SDK appends /v1/messages to its base URL itself.
    return rollout_id, anthropic.Anthropic(base_url=base_url.removesuffix("/v1"), api_key="unused", max_retries=0,
                                           timeout=180)


def native(engine_url: str, path: str, body: dict) -> dict:
    """The engine's own answer to `body` on its own route."""
    response = requests.post(f"{engine_url}{path}", json=body, timeout=180)
    assert response.status_code == 200, response.text
    return response.json()


def sse_events(url: str, body: dict) -> list[tuple[str, dict]]:
    """The event stream `url` answers `body` with, read off the wire: (event name, data) pairs."""
    response = requests.post(url, json={**body, "stream": True}, timeout=180)
    assert response.status_code == 200, response.text
    events = []
    for block in response.text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in lines and lines["data"] != "[DONE]":  # (an event with no name would be an error)
            events.append((lines.get("event", "(unnamed)"), json.loads(lines["data"])))
    return events


def shape(kinds: list[str]) -> list[str]:
    """A stream's event sequence with each run of one kind as one: how many tokens one delta carries depends
    on timing (a busy engine sends several at once), so only the order of kinds is comparable."""
    return [kind for index, kind in enumerate(kinds) if index == 0 or kinds[index - 1] != kind]


def assert_nothing_injected(body: str) -> None:
    """What the agent received has none of the fields the proxy asks the engine for (or vLLM's own)."""
    assert not [field for field in INJECTED if field in body], body


def assert_ids_decode_to(engine_url: str, engine_model: str, call: dict, text: str,
                         stop_sequence: str | None = None) -> None:
    """The recorded completion ids are the text the agent got: plus EOS for a turn the model ended, plus the
    stop string for one a stop sequence ended (the model sampled it; the answer leaves it out)."""
    ids = call["completion_token_ids"]
    assert len(call["completion_logprobs"]) == len(ids) > 0  # one sampling logprob per token
    assert all(isinstance(value, float) and value <= 0 for value in call["completion_logprobs"])
    if stop_sequence is not None:
        assert EOS not in ids and detokenize(engine_url, engine_model, ids) == text + stop_sequence
    else:
        assert detokenize(engine_url, engine_model, without_eos(ids, call["finish_reason"])) == text


def blocks(content: list) -> list[dict]:
    """Content blocks as JSON, leaving out an empty text block (see the stop-at-once case)."""
    dumped = [b if isinstance(b, dict) else b.model_dump(mode="json", exclude_none=True) for b in content]
    return [b for b in dumped if b != {"type": "text", "text": ""}]


# -- Responses: 1. prompt ids and answer ---------------------------------------------------------------
