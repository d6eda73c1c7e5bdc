"""What the five examples share, so each of them shows only its framework.

The task, the opening messages, the text tool protocol and the exact-answer reward are the ones `rlproxy demo`
trains on (demo/tasks.py, demo/agent.py); the rest is the glue every agent needs to be recorded by the proxy:
a base URL with the rollout id in its path, and one `POST /reward` when the episode is over.
"""
from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass

from demo.agent import (DEFAULT_MAX_TOKENS, DEFAULT_MAX_TURNS, DEFAULT_PROMPTS, REMINDER, parse_action,
                        run_tool, score)
from demo.tasks import CALC, Task, train_tasks

DEFAULT_PROXY = "http://127.0.0.1:8400"
DEFAULT_MODEL = "SmolLM2-135M-Instruct"  # the name `rlproxy serve` answers for in front of `rlproxy engine`
MAX_TURNS = DEFAULT_MAX_TURNS  # model calls per episode
MAX_TOKENS = DEFAULT_MAX_TOKENS  # per model call
TEMPERATURE = 1.0  # sample, as training needs


DEFAULT_SEED = 3  # "Each of 93 buses carries 84 people. ...": a template the base model gets right at times


def pick_task(seed: int = DEFAULT_SEED) -> Task:
    """A training problem such as "A box holds 75 rows of 45 eggs. How many eggs are in the box?"."""
    return train_tasks(1, seed=seed)[0]


def opening(task: Task) -> list[dict[str, str]]:
    """The system prompt, two worked examples as chat turns, then the question (OpenAI message dicts)."""
    return DEFAULT_PROMPTS[CALC].opening(task)


def tool_reply(text: str, task: Task) -> str | None:
    """The user turn answering a model reply ("RESULT: 3375", an error, a reminder); None once it ANSWERs."""
    action = parse_action(text)
    if action is not None and action.kind == "answer" and action.arg:
        return None
    if action is None or not action.arg:
        return REMINDER[CALC]
    if action.kind != task.tool:
        return f"ERROR: unknown tool {action.kind.upper()}; use {task.tool.upper()}"
    return run_tool(action.kind, action.arg, ignore_after_equals=True)


def final_reward(replies: list[str], task: Task) -> float:
    """1.0 when the episode's last reply is `ANSWER: <the exact product>`, else 0.0."""
    action = parse_action(replies[-1] if replies else None)
    return score(action.arg, task.answer) if action is not None and action.kind == "answer" else 0.0


def rollout_base_url(proxy: str, rollout_id: str) -> str:
    """The OpenAI base URL under which every call is recorded as part of rollout `rollout_id`."""
    return f"{proxy.rstrip('/')}/rollouts/{rollout_id}/v1"


def api_key() -> str:
    """The key the proxy wants when its authentication is on; any string when it is off."""
    return os.environ.get("OPENAI_API_KEY") or "unused"


def post_reward(proxy: str, rollout_id: str, task: Task, reward: float) -> dict:
    """The one call that reports the outcome: the final reward closes the rollout."""
    body = json.dumps({"rollout_id": rollout_id, "reward": reward, "task_id": task.task_id}).encode()
    request = urllib.request.Request(
        f"{proxy.rstrip('/')}/reward", data=body, method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key()}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@dataclass
class Outcome:
    rollout_id: str
    task_id: str
    reward: float
    replies: list[str]  # what the model wrote, one entry per call


def main(run_episode: Callable, description: str) -> None:
    """Command line of every example: run one episode through the proxy and print how it went."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--proxy", default=DEFAULT_PROXY, help="the proxy's base URL (no /v1)")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="the model name the proxy serves")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="which training problem to pose")
    parser.add_argument("--rollout-id", default=None, help="default: a new random id")
    parser.add_argument("--json", action="store_true", help="print the outcome as one JSON line")
    args = parser.parse_args()

    task = pick_task(args.seed)
    rollout_id = args.rollout_id or uuid.uuid4().hex
    started = time.perf_counter()
    outcome = run_episode(args.proxy, args.model, task, rollout_id)
    if inspect.isawaitable(outcome):
        outcome = asyncio.run(outcome)
    seconds = time.perf_counter() - started
    if args.json:
        print(json.dumps({**asdict(outcome), "seconds": round(seconds, 2)}))
        return
    print(f"task     {task.prompt}  (answer {task.answer})")
    for turn, reply in enumerate(outcome.replies, 1):
        print(f"model #{turn} {reply!r}")
    print(f"reward   {outcome.reward}  posted for rollout {outcome.rollout_id} ({seconds:.1f}s)")
    print(f"see it:  curl {args.proxy.rstrip('/')}/rollouts/{outcome.rollout_id}")
