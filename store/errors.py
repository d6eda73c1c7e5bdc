"""What store operations raise; the proxy maps these to HTTP statuses at its edge."""
from __future__ import annotations

from core.errors import RlproxyError


class StoreError(RlproxyError):
    """Base of every error a store query raises on purpose."""


class NotFound(StoreError):
    """The rollout, call or policy does not exist (or belongs to another project)."""


class NotYours(StoreError):
    """The rollout belongs to no project (the operator's, or recorded before keys): a project's key may read it
    but not add calls, rewards or events to it."""

    def __init__(self, rollout_id: str) -> None:
        super().__init__(f"rollout {rollout_id!r} belongs to no project (the operator's): a project's key may read it "
                         "but not add calls, rewards or events to it; create rollouts with the project's own key")


class Conflict(StoreError):
    """The request contradicts what is already stored, e.g. a different final reward for a closed rollout."""


class ActiveChanged(Conflict):
    """A version was to replace the one active, and another is active now (an operator's activation meanwhile)."""


class LeaseLost(Conflict):
    """A step's rollouts are no longer leased to the worker that trained them (its lease expired and another
    took them, or another process with the same worker id released them): its result is not recorded."""
