"""What a task family is: items with a stable id, split by a hash of their key, and a pure scoring function.

A family is data plus a scorer; the agent that runs it (bench/family_agent.py) is the same plain `openai` SDK
code for every family. An item's `item_id` names the problem: it is sent as `X-Task-Id`, so the trainer
compares the rollouts of one problem as a group.
"""
from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

HELDOUT_SHARE = 5  # one problem in five is held out: the numbers bench/learning.py reports are on those


@dataclass(frozen=True)
class Item:
    item_id: str  # names the problem (the trainer's group key)
    messages: tuple[dict[str, str], ...]  # what the agent sends, as chat messages
    expected: Any  # what `Family.score` compares the reply with


@dataclass(frozen=True)
class Family:
    name: str
    description: str
    max_tokens: int  # the agent's token budget per reply
    build: Callable[[], list[tuple[str, Item]]]  # every item with its split key
    score: Callable[[Item, str], float]  # 1.0 is a success; the reward the agent reports
    # The class an item belongs to when the classes are of unequal size (the tools family has 120 translation
    # requests and 18 timers): training draws and held-out samples are spread evenly over classes, so that
    # always giving the commonest answer does not pass for learning. None: every item is its own class.
    stratum: Callable[[Item], str] | None = None

    def items(self, split: str) -> list[Item]:
        """The split's items ("train" or "heldout") in a stable order; the two never share a split key."""
        return [item for key, item in self.build() if split_of(key) == split]

    def sample(self, split: str, count: int, rng: random.Random | None = None) -> list[Item]:
        """`count` items of the split spread evenly over strata: a seeded random draw with `rng`, else each
        stratum's items in turn (round robin), which is what a held-out evaluation uses."""
        strata: dict[str, list[Item]] = {}
        for item in self.items(split):
            strata.setdefault(self.stratum(item) if self.stratum else "", []).append(item)
        groups = [strata[key] for key in sorted(strata)]
        if rng is not None:
            return [rng.choice(rng.choice(groups)) for _ in range(count)]
        if len(groups) == 1:
            return [groups[0][i % len(groups[0])] for i in range(count)]
        return [groups[i % len(groups)][(i // len(groups)) % len(groups[i % len(groups)])] for i in range(count)]


def split_of(key: str) -> str:
    """"heldout" for one key in HELDOUT_SHARE, "train" otherwise; the same on every machine."""
    bucket = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % HELDOUT_SHARE
    return "heldout" if bucket == 0 else "train"


def without_fences(reply: str) -> str:
    """The reply with surrounding whitespace and one enclosing Markdown code fence removed."""
    text = reply.strip()
    if text.startswith("```") and text.endswith("```") and len(text) >= 6:
        text = text[3:-3]
        first, _, rest = text.partition("\n")
        text = rest if first.strip().isalpha() or not first.strip() else text  # a language tag line
    return text.strip()
