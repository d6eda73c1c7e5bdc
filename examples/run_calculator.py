"""The demo's calculator agent (demo/agent.py: plain `openai` SDK code with a text tool protocol) for
`rlproxy run`, named either way a user names an agent (docs/run.md):

    rlproxy run --tasks calc.jsonl --agent examples.run_calculator:solve --attempts 8
    rlproxy run --tasks calc.jsonl --command "python -m examples.run_calculator" --attempts 8

A task is one JSON object a line: {"id": "mul2x2:37*46", "prompt": "What is 37 * 46?", "answer": 1702,
"tool": "calc"} (`bench/run_learning.py` writes such files from demo/tasks.py). The reward is 1.0 when the
episode's ANSWER is the task's answer, else 0.0: returned by `solve`, printed as the last line by the command.
"""
from __future__ import annotations

import asyncio
import json
import os

import openai

from demo.agent import run_episode
from demo.tasks import CALC, Task


def as_task(task: dict) -> Task:
    return Task(task_id=str(task["id"]), prompt=task["prompt"], answer=task["answer"], tool=task.get("tool", CALC))


async def episode(client: openai.AsyncOpenAI, model: str, task: dict) -> float:
    result = await run_episode(client, model, as_task(task))
    return result.reward


async def solve(task: dict, config) -> float:
    """`--agent examples.run_calculator:solve`: the rollout's base URL, key and model name come in `config`."""
    async with openai.AsyncOpenAI(base_url=config.openai_base_url, api_key=config.api_key, max_retries=0) as client:
        return await episode(client, config.model, task)


async def main() -> None:
    """`--command "python -m examples.run_calculator"`: the same episode, the rollout from the environment."""
    async with openai.AsyncOpenAI(max_retries=0) as client:  # OPENAI_BASE_URL, OPENAI_API_KEY: the rollout's
        reward = await episode(client, os.environ["RLPROXY_MODEL"], json.loads(os.environ["RLPROXY_TASK"]))
    print(reward)  # the last line of standard output: the reward


if __name__ == "__main__":
    asyncio.run(main())
