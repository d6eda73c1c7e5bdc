"""The agent every task family runs: plain `openai` SDK code pointed at rlproxy, plus one POST /reward.

    agent = FamilyAgent(proxy_url, model, family)
    reward = await agent.episode(item)                 # a training rollout: one chat call, scored, rewarded
    success = await agent.evaluate(items)              # evaluation rollouts (X-Rlproxy-Eval: 1), never trained

Nothing here knows about training: the rollout id, task id and evaluation flag are headers, which is all an
unmodified agent adds (its base URL would do as well). Sampling is the agent's own (temperature 1.0), the same
for training and evaluation, so the held-out number is what this agent would score when it runs.
"""
from __future__ import annotations

import asyncio
import uuid

import httpx
import openai

from bench.families import Family, Item

TEMPERATURE = 1.0


class FamilyAgent:
    def __init__(self, proxy_url: str, model: str, family: Family, concurrency: int = 16) -> None:
        self.proxy_url = proxy_url
        self.model = model
        self.family = family
        self.client = openai.AsyncOpenAI(base_url=f"{proxy_url}/v1", api_key="bench", max_retries=2,
                                         timeout=120)
        self.http = httpx.AsyncClient(base_url=proxy_url, timeout=30)
        self.slots = asyncio.Semaphore(concurrency)

    async def episode(self, item: Item, *, evaluation: bool = False) -> tuple[str, float]:
        """One rollout of `item`: ask, score the reply, report the score as the rollout's reward. Returns the
        rollout id and the reward."""
        rollout_id = f"{'eval' if evaluation else 'train'}-{uuid.uuid4().hex}"
        headers = {"X-Rollout-Id": rollout_id, "X-Task-Id": item.item_id, "X-Agent-Name": self.family.name}
        if evaluation:
            headers["X-Rlproxy-Eval"] = "1"
        async with self.slots:
            reply = await self.client.chat.completions.create(
                model=self.model, messages=list(item.messages), temperature=TEMPERATURE,
                max_tokens=self.family.max_tokens, extra_headers=headers)
        reward = self.family.score(item, reply.choices[0].message.content or "")
        answer = await self.http.post("/reward", json={"rollout_id": rollout_id, "reward": reward})
        answer.raise_for_status()
        return rollout_id, reward

    async def group(self, item: Item, size: int) -> list[tuple[str, float]]:
        """`size` training rollouts of one item at once: the trainer compares them as a group."""
        return list(await asyncio.gather(*(self.episode(item) for _ in range(size))))

    async def evaluate(self, items: list[Item]) -> float:
        """Success rate over `items`, each run once as an evaluation rollout."""
        done = await asyncio.gather(*(self.episode(item, evaluation=True) for item in items))
        return sum(reward >= 1.0 for _, reward in done) / len(done)

    async def trained(self, rollout_id: str) -> bool:
        """Whether the trainer has consumed the rollout (trained on it, or found nothing in it to learn)."""
        answer = await self.http.get(f"/rollouts/{rollout_id}")
        answer.raise_for_status()
        return bool(answer.json()["trained"])

    async def active_version(self) -> int:
        answer = await self.http.get("/policies")
        answer.raise_for_status()
        return int(answer.json()["active"])

    async def close(self) -> None:
        await self.client.close()
        await self.http.aclose()
