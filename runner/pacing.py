"""On-policy pacing for a run that feeds a trainer: at most `limit` training attempts running or waiting for the
trainer at once. Without it sampling runs ahead of training, later steps learn from rollouts of versions well
behind the one they update, and in bench/run_learning.py held-out success fell (docs/run.md, Learning).
Evaluation attempts are never held back: the trainer never consumes them."""
from __future__ import annotations

import asyncio
from collections.abc import Callable

from runner.attempt import Outcome
from runner.client import ProxyClient

REWARDED = "rewarded"


class Pacer:
    def __init__(self, client: ProxyClient, limit: int, say: Callable[[str], None] | None = None,
                 poll_seconds: float = 1.0) -> None:
        self.client, self.limit, self.say, self.poll_seconds = client, limit, say, poll_seconds
        self.running = 0
        self.untrained: set[str] = set()  # rewarded training rollouts the trainer has not consumed yet
        self._said = False

    def _full(self) -> bool:
        return self.running + len(self.untrained) >= self.limit

    async def enter(self) -> None:
        """Waits until a training attempt may start, then counts it as running."""
        while self._full():
            await self._refresh()
            if not self._full():
                break
            if not self._said and self.say is not None:  # once per wait
                self.say(f"waiting for the trainer: {len(self.untrained)} rollouts not trained yet, "
                         f"{self.running} attempts running (--max-untrained {self.limit})")
                self._said = True
            await asyncio.sleep(self.poll_seconds)
        self._said = False
        self.running += 1

    def leave(self, outcome: Outcome) -> None:
        """The attempt ended: a rewarded rollout waits for the trainer; anything else never will."""
        self.running -= 1
        if outcome.status == REWARDED and outcome.rollout_id:
            self.untrained.add(outcome.rollout_id)

    async def _refresh(self) -> None:
        for rollout_id in list(self.untrained):
            stored = await self.client.rollout(rollout_id)
            if stored is None or stored.get("trained"):
                self.untrained.discard(rollout_id)
