"""The runner's errors, by what the command does with them. They join rlproxy's one tree (core/errors.py)."""
from __future__ import annotations

from core.errors import RlproxyError


class RunInputError(RlproxyError):
    """Bad input found before anything starts (a task file, an agent that cannot be imported): exit 2."""


class ProxyRefused(RlproxyError):
    """The proxy refused the runner itself (a wrong key, a bad request): the run stops."""


class InfrastructureError(RlproxyError):
    """The proxy or the engine behind it could not serve: the attempt is tried again with a new rollout."""


class AttemptError(RlproxyError):
    """This attempt cannot go on (its agent's program cannot be started): it fails with this reason, logged with
    it, and the run goes on with the other attempts."""


class TaskDataError(AttemptError):
    """One task's data cannot be given to the agent the way it is asked for (a NUL in an environment variable,
    text that is not Unicode, a value too large for the environment): that attempt fails, not the run."""


class RolloutRefused(AttemptError):
    """The proxy refused to start this attempt's rollout for what the attempt sent (its task id, agent name or
    metadata: a 4xx other than a refused key or the rate limit): that attempt fails with the proxy's reason."""
