"""Which version of its policy a running rollout's next call gets: the newest (on-policy), or for a while the one
its first call got (the engine's prefix cache stays warm).

    pins = RolloutPins(hold_seconds=25)          # 0: every call gets the newest version
    version = pins.keep(rollout_id, "default", newest)   # in PolicyRouter.policy_for
    pins.serving({("default", 3), ("default", 4)})   # after each read of what serves (PolicyRouter.refresh)

vLLM keys its prefix cache by adapter: a rollout whose next call names the version published while it ran
prefills its whole context again (an agent 20 turns into a 30,000-token conversation re-reads all of it). With
a hold, the rollout keeps the version that answered its first call until that version has stopped serving for
`hold_seconds`; after that it moves to the newest. The trainer unloads a version `drain_seconds` (30) after it
stops serving, so the hold must stay under that, or the rollout's call would name an adapter no longer loaded.

What a hold costs: its calls are sampled by an older policy than the one training goes on from (lag 1 or more:
trainer/staleness.py), weighed by the decoupled PPO importance ratio, or skipped past `max_staleness`. Each proxy
keeps its own pins in memory (the last ROLLOUT_PINS rollouts): a rollout whose calls go through several proxies is
held by each on the version it first saw there, and a restarted proxy pins anew.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from store.policies import ActivePolicy

ROLLOUT_PINS = 65_536  # rollouts whose starting version is remembered (a few MB)


class RolloutPins:
    def __init__(self, hold_seconds: float = 0.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.hold = hold_seconds
        self.clock = clock
        self._started: OrderedDict[tuple[str, str], ActivePolicy] = OrderedDict()  # (rollout, policy) -> version
        self._stopped: dict[tuple[str, int], float] = {}  # (policy, version) -> when this proxy saw it stop serving
        self._serving: set[tuple[str, int]] = set()

    def keep(self, rollout_id: str | None, policy: str, newest: ActivePolicy) -> ActivePolicy:
        """The version that answers this call of `rollout_id`: the one it started on while that is held, else
        `newest` (which the rollout then keeps). Without a hold or a rollout: `newest`."""
        if self.hold <= 0 or rollout_id is None:
            return newest
        key = (rollout_id, policy)
        started = self._started.get(key)
        if started is not None and started.version != newest.version and self._held((policy, started.version)):
            self._started.move_to_end(key)
            return started
        self._started[key] = newest
        self._started.move_to_end(key)
        if len(self._started) > ROLLOUT_PINS:
            self._started.popitem(last=False)
        return newest

    def serving(self, versions: Iterable[tuple[str, int]]) -> None:
        """What serves now: (policy, version) of every policy's active and canary versions, the base model's
        included; one gone from it stopped now."""
        now, versions = self.clock(), set(versions)
        for version in self._serving - versions:
            self._stopped.setdefault(version, now)
        for version in versions:
            self._stopped.pop(version, None)
        for version, since in list(self._stopped.items()):
            if now - since >= self.hold:  # no rollout is held on it any more
                del self._stopped[version]
        self._serving = versions

    def _held(self, version: tuple[str, int]) -> bool:
        if version in self._serving:  # still serving (a canary, or the active version of a rollback)
            return True
        since = self._stopped.get(version)
        return since is not None and self.clock() - since < self.hold
