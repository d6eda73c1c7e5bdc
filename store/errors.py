"""What store operations raise; the proxy maps these to HTTP statuses at its edge."""
from __future__ import annotations

from sqlalchemy.exc import DBAPIError

from core.errors import RlproxyError

# SQLSTATE classes that say the database cannot answer now, whatever was asked: a connection failure (08), an
# aborted transaction to retry (40), insufficient resources (53: disk full, too many connections), an object not
# in the state the statement needs (55: 55000 during a failover or recovery, 55P03 a lock not available, 55006
# in use), an operator's intervention (57: a shutdown, a cancel) and a system error (58). A request meeting one
# is answered 503 with Retry-After, not 500.
NOT_READY_CLASSES = frozenset({"08", "40", "53", "55", "57", "58"})
READ_ONLY = "25006"  # a standby, or a primary just demoted by a failover


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE the database answered with, where the driver tells it (asyncpg, psycopg)."""
    orig = getattr(exc, "orig", None)
    state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return str(state) if state else None


def database_not_ready(exc: DBAPIError) -> bool:
    """Whether a database error is the database's state rather than the request's doing (see NOT_READY_CLASSES)."""
    state = sqlstate(exc)
    return state is not None and (state[:2] in NOT_READY_CLASSES or state == READ_ONLY)


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
