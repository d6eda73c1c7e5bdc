"""A two-role agent: a solver answers, a checker accepts or rejects the answer. Plain `openai` SDK code; the
only thing it does for rlproxy is name each role in its base URL (`/rollouts/{id}/agents/{role}/v1`) and post
one reward per episode. Which role learns, and as which policy, is the proxy's routing rules' business:

    rlproxy serve --policy-rule agent:solver=solver --default-policy base      # only the solver learns
    rlproxy serve --policy-rule agent:solver=solver --policy-rule agent:checker=checker
    rlproxy train --policy solver [--policy checker]

    python -m examples.solver_checker --proxy http://127.0.0.1:8400

The task is the `lists` family's (bench/families/lists.py: "List 3 birds. Write exactly 3 lines, each starting
with "- " ..."). The checker sees the instruction and the solver's answer and must reply with one word, ACCEPT
or REJECT. Both roles share the episode's reward: two thirds for a correct answer, one third for a right verdict.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import uuid
from dataclasses import asdict, dataclass

import httpx
import openai

from bench.families.base import Item
from bench.families.lists import FAMILY

SOLVER, CHECKER = "solver", "checker"
ACCEPT, REJECT = "ACCEPT", "REJECT"
TEMPERATURE = 1.0
CHECKER_MAX_TOKENS = 8
CHECKER_PROMPT = (
    "You check another assistant's work. The instruction was:\n{instruction}\n\nThe answer was:\n{answer}\n\n"
    "Does the answer follow the instruction exactly? Reply with one word: ACCEPT or REJECT."
)
_EXAMPLE = ('List {n} {what}. Write exactly {n} lines, each starting with "- " followed by the name only, and '
            'nothing else.')
# Two worked examples as earlier turns, as the solver gets (their categories are in neither split).
CHECKER_EXAMPLES = (
    {"role": "user", "content": CHECKER_PROMPT.format(instruction=_EXAMPLE.format(n=2, what="kinds of pasta"),
                                                      answer="- spaghetti\n- penne")},
    {"role": "assistant", "content": ACCEPT},
    {"role": "user", "content": CHECKER_PROMPT.format(instruction=_EXAMPLE.format(n=3, what="colors of the rainbow"),
                                                      answer="Sure! Here are three colors:\n1. red\n2. green")},
    {"role": "assistant", "content": REJECT},
)


@dataclass
class Episode:
    rollout_id: str
    task_id: str
    answer: str
    verdict: str  # what the checker wrote
    solved: bool  # the answer follows the instruction (the task's own scorer)
    judged: bool  # the checker wrote exactly ACCEPT or REJECT, and the right one
    reward: float


def verdict_of(text: str) -> str | None:
    """ACCEPT or REJECT when that is all the checker wrote (case and a final period aside), else None."""
    word = text.strip().rstrip(".").upper()
    return word if word in (ACCEPT, REJECT) else None


def reward_of(solved: bool, judged: bool) -> float:
    """The episode's one reward, shared by both roles. Not halves: with equal weights a checker that always
    rejects makes every episode worth 0.5 whatever the solver does (a wrong answer rejected = a right one
    rejected), and neither role can learn from there — a trap two trained roles did fall into."""
    return (2 * solved + judged) / 3


def role_url(proxy: str, rollout_id: str, role: str) -> str:
    return f"{proxy.rstrip('/')}/rollouts/{rollout_id}/agents/{role}/v1"


async def run_episode(proxy: str, model: str, item: Item, *, evaluation: bool = False,
                      api_key: str | None = None) -> Episode:
    """One episode: the solver answers, the checker judges, the reward is posted. With `evaluation` the
    rollout is evaluation traffic (`X-Rlproxy-Eval: 1`): served the same, never trained on."""
    rollout_id = f"{'eval' if evaluation else 'train'}-{uuid.uuid4().hex}"
    key = api_key or os.environ.get("OPENAI_API_KEY") or "unused"
    headers = {"X-Task-Id": item.item_id, **({"X-Rlproxy-Eval": "1"} if evaluation else {})}
    async with openai.AsyncOpenAI(base_url=role_url(proxy, rollout_id, SOLVER), api_key=key, max_retries=2,
                                  timeout=600, default_headers=headers) as solver:
        reply = await solver.chat.completions.create(model=model, messages=list(item.messages),
                                                     temperature=TEMPERATURE, max_tokens=FAMILY.max_tokens)
    answer = reply.choices[0].message.content or ""
    instruction = item.messages[-1]["content"]
    async with openai.AsyncOpenAI(base_url=role_url(proxy, rollout_id, CHECKER), api_key=key, max_retries=2,
                                  timeout=600, default_headers=headers) as checker:
        reply = await checker.chat.completions.create(
            model=model, temperature=TEMPERATURE, max_tokens=CHECKER_MAX_TOKENS,
            messages=[*CHECKER_EXAMPLES,
                      {"role": "user", "content": CHECKER_PROMPT.format(instruction=instruction, answer=answer)}])
    verdict = reply.choices[0].message.content or ""
    solved = FAMILY.score(item, answer) >= 1.0
    judged = verdict_of(verdict) == (ACCEPT if solved else REJECT)
    reward = reward_of(solved, judged)
    async with httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {key}"}) as http:
        posted = await http.post(f"{proxy.rstrip('/')}/reward",
                                 json={"rollout_id": rollout_id, "reward": reward, "task_id": item.item_id})
        posted.raise_for_status()
    return Episode(rollout_id, item.item_id, answer, verdict, solved, judged, reward)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--proxy", default="http://127.0.0.1:8400", help="the proxy's base URL (no /v1)")
    parser.add_argument("--model", default="SmolLM2-135M-Instruct", help="the model name the proxy serves")
    parser.add_argument("--seed", type=int, default=0, help="which training item to pose")
    args = parser.parse_args()
    item = random.Random(args.seed).choice(FAMILY.items("train"))
    print(json.dumps(asdict(asyncio.run(run_episode(args.proxy, args.model, item)))))


if __name__ == "__main__":
    main()
