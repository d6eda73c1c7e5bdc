"""What store operations raise; the proxy maps these to HTTP statuses at its edge."""
from __future__ import annotations

from core.errors import RlproxyError


class StoreError(RlproxyError):
    """Base of every error a store query raises on purpose."""


class NotFound(StoreError):
    """The rollout, call or policy does not exist (or belongs to another project)."""


class Conflict(StoreError):
    """The request contradicts what is already stored, e.g. a different final reward for a closed rollout."""
