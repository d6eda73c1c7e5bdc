"""A two-role agent: a solver drafts an answer, a reviser turns the draft into the final answer. Plain `openai`
SDK code; the only things it does for rlproxy are naming each role in its base URL
(`/rollouts/{id}/agents/{role}/v1`) and posting rewards. Which role learns, and as which policy, is the proxy's
routing rules' business:

    rlproxy serve --policy-rule agent:solver=solver --default-policy base      # only the solver learns
    rlproxy serve --policy-rule agent:solver=solver --policy-rule agent:reviser=reviser
    rlproxy train --policy solver [--policy reviser]

    python -m examples.solver_reviser --proxy http://127.0.0.1:8400

The task is the `lists` family's (bench/families/lists.py: "List 3 birds. Write exactly 3 lines, each starting
with "- " ..."). The reviser sees the instruction and the solver's draft and writes the final answer: the draft
kept where it is right, mended where it is not. Rewards, the way a team with two roles would give them:

* the episode's reward (shared by every call) is the team's outcome: 1 when the final answer follows the
  instruction, else 0;
* each role's own call also gets a reward for its own part (`POST /reward` with that call's
  `X-Rlproxy-Call-Id`): the solver's +1 when its draft already follows the instruction, -1 when not; the
  reviser's the same for its final answer. Without it the solver's part would fade from its reward as the
  reviser learns to mend drafts (a mended bad draft makes as good an episode as a good draft), and the reviser's
  advantage would only say how its answer compares with the rest of its group, not whether it was right.
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

SOLVER, REVISER = "solver", "reviser"
TEMPERATURE = 1.0
REVISER_PROMPT = (
    "Another assistant was given this instruction:\n{instruction}\n\nIts answer was:\n{draft}\n\n"
    "Write the final answer: follow the instruction exactly, keep what is right in the answer and fix the rest. "
    "Write only the final answer."
)
_EXAMPLE = ('List {n} {what}. Write exactly {n} lines, each starting with "- " followed by the name only, and '
            'nothing else.')
# Two worked examples as earlier turns, as the solver gets (their categories are in neither split): one draft
# mended, one kept as it was.
REVISER_EXAMPLES = (
    {"role": "user", "content": REVISER_PROMPT.format(instruction=_EXAMPLE.format(n=3, what="colors of the rainbow"),
                                                      draft="Sure! Here are three colors:\n1. red\n2. green")},
    {"role": "assistant", "content": "- red\n- green\n- violet"},
    {"role": "user", "content": REVISER_PROMPT.format(instruction=_EXAMPLE.format(n=2, what="kinds of pasta"),
                                                      draft="- spaghetti\n- penne")},
    {"role": "assistant", "content": "- spaghetti\n- penne"},
)


@dataclass
class Episode:
    rollout_id: str
    task_id: str
    draft: str  # what the solver wrote
    final: str  # what the reviser made of it: the team's answer
    drafted: bool  # the draft follows the instruction (the task's own scorer): the solver's success
    solved: bool  # the final answer follows it: the reviser's and the team's success (the episode's reward)


def role_url(proxy: str, rollout_id: str, role: str) -> str:
    return f"{proxy.rstrip('/')}/rollouts/{rollout_id}/agents/{role}/v1"


async def _ask(proxy: str, model: str, role: str, messages: list[dict[str, str]], *, rollout_id: str, key: str,
               headers: dict[str, str]) -> tuple[str, str]:
    """One role's call: (what it wrote, the call id the proxy gave, to reward that call on its own)."""
    async with openai.AsyncOpenAI(base_url=role_url(proxy, rollout_id, role), api_key=key, max_retries=2,
                                  timeout=600, default_headers=headers) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=model, messages=messages, temperature=TEMPERATURE, max_tokens=FAMILY.max_tokens)
    return raw.parse().choices[0].message.content or "", raw.headers.get("x-rlproxy-call-id", "")


async def solve(proxy: str, model: str, item: Item, *, rollout_id: str, key: str,
                headers: dict[str, str]) -> tuple[str, str]:
    """The solver's draft for `item`: (what it wrote, its call id)."""
    return await _ask(proxy, model, SOLVER, list(item.messages), rollout_id=rollout_id, key=key, headers=headers)


async def revise(proxy: str, model: str, item: Item, draft: str, *, rollout_id: str, key: str,
                 headers: dict[str, str]) -> tuple[str, str]:
    """The reviser's final answer to `item`, made from `draft`: (what it wrote, its call id)."""
    prompt = REVISER_PROMPT.format(instruction=item.messages[-1]["content"], draft=draft)
    return await _ask(proxy, model, REVISER, [*REVISER_EXAMPLES, {"role": "user", "content": prompt}],
                      rollout_id=rollout_id, key=key, headers=headers)


def follows(item: Item, answer: str) -> bool:
    return FAMILY.score(item, answer) >= 1.0


def evaluation_headers(item: Item) -> dict[str, str]:
    """Evaluation traffic (`X-Rlproxy-Eval: 1`) is served the same and never trained on."""
    return {"X-Task-Id": item.item_id, "X-Rlproxy-Eval": "1"}


def api_key_of(api_key: str | None) -> str:
    return api_key or os.environ.get("OPENAI_API_KEY") or "unused"


async def run_episode(proxy: str, model: str, item: Item, *, evaluation: bool = False,
                      api_key: str | None = None) -> Episode:
    """One episode: the solver drafts, the reviser writes the final answer, the rewards are posted (the calls'
    first: the final reward closes the rollout)."""
    rollout_id = f"{'eval' if evaluation else 'train'}-{uuid.uuid4().hex}"
    key = api_key_of(api_key)
    headers = evaluation_headers(item) if evaluation else {"X-Task-Id": item.item_id}
    draft, solver_call = await solve(proxy, model, item, rollout_id=rollout_id, key=key, headers=headers)
    final, reviser_call = await revise(proxy, model, item, draft, rollout_id=rollout_id, key=key, headers=headers)
    drafted, solved = follows(item, draft), follows(item, final)
    async with httpx.AsyncClient(base_url=proxy, timeout=30, headers={"Authorization": f"Bearer {key}"}) as http:
        for body in ({"rollout_id": rollout_id, "call_id": solver_call, "reward": 1.0 if drafted else -1.0},
                     {"rollout_id": rollout_id, "call_id": reviser_call, "reward": 1.0 if solved else -1.0},
                     {"rollout_id": rollout_id, "reward": float(solved), "task_id": item.item_id}):
            (await http.post("/reward", json=body)).raise_for_status()
    return Episode(rollout_id, item.item_id, draft, final, drafted, solved)


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
