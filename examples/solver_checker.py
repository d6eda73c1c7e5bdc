"""A two-role agent: a solver answers, a checker accepts or rejects the answer. Plain `openai` SDK code; the
only things it does for rlproxy are naming each role in its base URL (`/rollouts/{id}/agents/{role}/v1`) and
posting rewards. Which role learns, and as which policy, is the proxy's routing rules' business:

    rlproxy serve --policy-rule agent:solver=solver --default-policy base      # only the solver learns
    rlproxy serve --policy-rule agent:solver=solver --policy-rule agent:checker=checker
    rlproxy train --policy solver [--policy checker]

    python -m examples.solver_checker --proxy http://127.0.0.1:8400

The task is the `lists` family's (bench/families/lists.py: "List 3 birds. Write exactly 3 lines, each starting
with "- " ..."). The checker sees the instruction and the solver's answer and must reply with one word, ACCEPT
or REJECT. Rewards, the way a team with two roles would give them:

* the episode's reward (shared by every call) is the team's outcome: 1 when the answer follows the instruction;
* the checker's own call gets a reward for its verdict (`POST /reward` with that call's `X-Rlproxy-Call-Id`):
  +1 when right, -1 when wrong or not one of the two words.

Why the checker needs its own: from the shared outcome alone it cannot tell its part from the solver's (the
outcome moves with the answer, not with the verdict), and when a verdict was folded into the shared reward the
trained checker settled on always answering the verdict that was commoner at the time (docs/policies.md).
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
    solved: bool  # the answer follows the instruction (the task's own scorer): the episode's reward
    judged: bool  # the checker wrote exactly ACCEPT or REJECT, and the right one
    reward: float


def verdict_of(text: str) -> str | None:
    """ACCEPT or REJECT when that is all the checker wrote (case and a final period aside), else None."""
    word = text.strip().rstrip(".").upper()
    return word if word in (ACCEPT, REJECT) else None


def verdict_reward(judged: bool) -> float:
    """The checker's own reward for its call: centred on zero, so a checker that is right as often as wrong
    gains nothing on average, whatever the solver's answers are worth."""
    return 1.0 if judged else -1.0


def role_url(proxy: str, rollout_id: str, role: str) -> str:
    return f"{proxy.rstrip('/')}/rollouts/{rollout_id}/agents/{role}/v1"


def _client(proxy: str, rollout_id: str, role: str, key: str, headers: dict[str, str]) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=role_url(proxy, rollout_id, role), api_key=key, max_retries=2,
                              timeout=600, default_headers=headers)


async def check(proxy: str, model: str, item: Item, answer: str, *, rollout_id: str, key: str,
                headers: dict[str, str]) -> tuple[str, str]:
    """The checker's verdict on `answer` to `item`'s instruction: (what it wrote, the call id the proxy gave)."""
    instruction = item.messages[-1]["content"]
    async with _client(proxy, rollout_id, CHECKER, key, headers) as checker:
        raw = await checker.chat.completions.with_raw_response.create(
            model=model, temperature=TEMPERATURE, max_tokens=CHECKER_MAX_TOKENS,
            messages=[*CHECKER_EXAMPLES,
                      {"role": "user", "content": CHECKER_PROMPT.format(instruction=instruction, answer=answer)}])
    return raw.parse().choices[0].message.content or "", raw.headers.get("x-rlproxy-call-id", "")


def evaluation_headers(item: Item) -> dict[str, str]:
    """Evaluation traffic (`X-Rlproxy-Eval: 1`) is served the same and never trained on."""
    return {"X-Task-Id": item.item_id, "X-Rlproxy-Eval": "1"}


def api_key_of(api_key: str | None) -> str:
    return api_key or os.environ.get("OPENAI_API_KEY") or "unused"


async def run_episode(proxy: str, model: str, item: Item, *, evaluation: bool = False,
                      api_key: str | None = None) -> Episode:
    """One episode: the solver answers, the checker judges, the rewards are posted (the checker's call's
    first: the final reward closes the rollout)."""
    rollout_id = f"{'eval' if evaluation else 'train'}-{uuid.uuid4().hex}"
    key = api_key_of(api_key)
    headers = evaluation_headers(item) if evaluation else {"X-Task-Id": item.item_id}
    async with _client(proxy, rollout_id, SOLVER, key, headers) as solver:
        reply = await solver.chat.completions.create(model=model, messages=list(item.messages),
                                                     temperature=TEMPERATURE, max_tokens=FAMILY.max_tokens)
    answer = reply.choices[0].message.content or ""
    verdict, checker_call = await check(proxy, model, item, answer, rollout_id=rollout_id, key=key,
                                        headers=headers)
    solved = FAMILY.score(item, answer) >= 1.0
    judged = verdict_of(verdict) == (ACCEPT if solved else REJECT)
    async with httpx.AsyncClient(base_url=proxy, timeout=30, headers={"Authorization": f"Bearer {key}"}) as http:
        for body in ({"rollout_id": rollout_id, "call_id": checker_call, "reward": verdict_reward(judged)},
                     {"rollout_id": rollout_id, "reward": float(solved), "task_id": item.item_id}):
            (await http.post("/reward", json=body)).raise_for_status()
    return Episode(rollout_id, item.item_id, answer, verdict, solved, judged, float(solved))


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
