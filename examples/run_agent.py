"""An agent for `rlproxy run --agent`: a function given the task and the rollout's client settings, returning
the reward (docs/run.md). One model call through the rollout's base URL, so the proxy records it; the reward is
1.0 when the reply's first number is the task's answer.

    rlproxy run --tasks examples/run_tasks.jsonl --agent examples.run_agent:solve --attempts 4
    rlproxy run --tasks examples/run_tasks.jsonl --agent examples.run_agent:solve_async --attempts 4
"""
from __future__ import annotations

import re

from openai import AsyncOpenAI, OpenAI

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def score(reply: str | None, answer: str) -> float:
    """1.0 when the first number in the reply is the answer, else 0.0."""
    found = NUMBER.search(reply or "")
    return 1.0 if found and found.group() == str(answer) else 0.0


def _messages(task: dict) -> list[dict]:
    return [{"role": "user", "content": task["question"]}]


def solve(task: dict, config) -> float:
    client = OpenAI(base_url=config.openai_base_url, api_key=config.api_key)
    reply = client.chat.completions.create(model=config.model, messages=_messages(task), max_tokens=12,
                                           temperature=1.0)
    return score(reply.choices[0].message.content, task["answer"])


async def solve_async(task: dict, config) -> float:
    async with AsyncOpenAI(base_url=config.openai_base_url, api_key=config.api_key) as client:
        reply = await client.chat.completions.create(model=config.model, messages=_messages(task), max_tokens=12,
                                                     temperature=1.0)
    return score(reply.choices[0].message.content, task["answer"])
