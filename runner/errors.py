"""The runner's errors, by what the command does with them."""
from __future__ import annotations

from core.errors import RlproxyError


class RunInputError(RlproxyError):
    """Bad input found before anything starts (a task file, an agent that cannot be imported): exit 2."""


class ProxyRefused(RlproxyError):
    """The proxy refused the runner itself (a wrong key, a bad request): the run stops."""


class InfrastructureError(RlproxyError):
    """The proxy or the engine behind it could not serve: the attempt is tried again with a new rollout."""
