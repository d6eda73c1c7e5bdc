"""An agent with no reward code: plain `openai` SDK calls through the proxy, the rollout and task named in
headers, and nothing else — no `POST /reward`. It learns when the trainer judges its rollouts
(`rlproxy train --reward judge`, docs/judge.md): the judge compares the episodes of one task with each other.

    python -m examples.unrewarded_agent --proxy http://127.0.0.1:8400

The task is the `lists` family's (bench/families/lists.py): "List 3 birds. Write exactly 3 lines, ...".
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import uuid

import openai

from bench.families.base import Item
from bench.families.lists import FAMILY

TEMPERATURE = 1.0


async def run_episode(proxy: str, model: str, item: Item, *, evaluation: bool = False) -> tuple[str, str]:
    """One episode of `item`; returns (rollout id, the model's answer). With `evaluation` the rollout is
    evaluation traffic (`X-Rlproxy-Eval: 1`): served alike, never judged nor trained on."""
    rollout_id = f"{'eval' if evaluation else 'train'}-{uuid.uuid4().hex}"
    headers = {"X-Rollout-Id": rollout_id, "X-Task-Id": item.item_id, **({"X-Rlproxy-Eval": "1"} if evaluation else {})}
    key = os.environ.get("OPENAI_API_KEY", "unused")
    base_url = f"{proxy.rstrip('/')}/v1"
    async with openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=2, timeout=120) as client:
        reply = await client.chat.completions.create(model=model, messages=list(item.messages),
                                                     temperature=TEMPERATURE, max_tokens=FAMILY.max_tokens,
                                                     extra_headers=headers)
    return rollout_id, reply.choices[0].message.content or ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--proxy", default="http://127.0.0.1:8400", help="the proxy's base URL (no /v1)")
    parser.add_argument("--model", default="SmolLM2-135M-Instruct", help="the model name the proxy serves")
    parser.add_argument("--seed", type=int, default=0, help="which training item to pose")
    args = parser.parse_args()
    item = random.Random(args.seed).choice(FAMILY.items("train"))
    rollout_id, answer = asyncio.run(run_episode(args.proxy, args.model, item))
    print(f"rollout {rollout_id}\n{answer}")


if __name__ == "__main__":
    main()
