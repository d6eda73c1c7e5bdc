"""The agent every task family runs: plain `openai` SDK code pointed at a rollout's base URL, its score the
rollout's reward. The runner (runner/) drives it: it creates each rollout (the item's id as task id, the
family's name as agent, evaluation or not), runs the attempts `concurrency` at a time, posts the score.

    async with FamilyAgent(proxy_url, model, family) as agent:
        done = await agent.groups(items, size)        # training rollouts: `size` of each item, a group each
        success = await agent.evaluate(items)         # evaluation rollouts, never trained on

Nothing in the agent knows about training: its base URL is all rlproxy adds. Sampling is the agent's own
(temperature 1.0), the same for training and evaluation, so the held-out number is what this agent would score
when it runs.
"""
from __future__ import annotations

import httpx
import openai

from bench.families import Family, Item
from core.settings import RunSettings
from runner.agents import ClientConfig
from runner.attempt import Outcome
from runner.run import Runner
from runner.tasks import Task

TEMPERATURE = 1.0


class FamilyAgent:
    def __init__(self, proxy_url: str, model: str, family: Family, concurrency: int = 16) -> None:
        self.proxy_url = proxy_url
        self.model = model
        self.family = family
        # one connection pool; each attempt gets a copy of the client with its rollout's base URL
        self.client = openai.AsyncOpenAI(base_url=f"{proxy_url}/v1", api_key="bench", max_retries=2,
                                         timeout=120)
        self.http = httpx.AsyncClient(base_url=proxy_url, timeout=30)
        self.runner = Runner(self.answer, RunSettings(proxy=proxy_url, concurrency=concurrency,
                                                      agent_name=family.name))

    async def __aenter__(self) -> FamilyAgent:
        await self.runner.open()
        return self

    async def __aexit__(self, *_) -> None:
        await self.close()

    async def answer(self, item: Item, config: ClientConfig) -> float:
        """One rollout of `item`: ask, score the reply; the score is the rollout's reward."""
        client = self.client.with_options(base_url=config.openai_base_url)
        reply = await client.chat.completions.create(
            model=self.model, messages=list(item.messages), temperature=TEMPERATURE,
            max_tokens=self.family.max_tokens)
        return self.family.score(item, reply.choices[0].message.content or "")

    async def groups(self, items: list[Item], size: int) -> list[tuple[str, float]]:
        """`size` training rollouts of each item (the trainer compares one item's as a group): (rollout id,
        reward) of each, in the order they ended."""
        return _rewarded(await self.runner.run([Task(item.item_id, item) for item in items], attempts=size))

    async def evaluate(self, items: list[Item]) -> float:
        """Success rate over `items`, each run once as an evaluation rollout."""
        done = _rewarded(await self.runner.run([Task(item.item_id, item) for item in items], evaluation=True))
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
        await self.runner.close()
        await self.client.close()
        await self.http.aclose()


def _rewarded(outcomes: list[Outcome]) -> list[tuple[str, float]]:
    """A measurement with a rollout missing would be wrong, not smaller: any attempt without a reward (after
    the runner's tries on new rollouts when the proxy or engine failed) stops the run."""
    missing = [outcome for outcome in outcomes if outcome.reward is None]
    if missing:
        raise RuntimeError(f"{len(missing)} of {len(outcomes)} rollouts ended without a reward; the first: "
                           f"{missing[0].status} ({missing[0].error})")
    return [(outcome.rollout_id, outcome.reward) for outcome in outcomes]
