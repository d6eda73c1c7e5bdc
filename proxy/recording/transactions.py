"""Storing calls in the database, one transaction per batch, and telling the database being unreachable (the
writer spools and retries) from the database refusing what a call contains (that call is set aside) and from one
call too slow to store (its batch is split; alone, it is set aside once the database shows it takes the others)."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable

from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from proxy.metrics import ProxyMetrics
from proxy.recording.rejected import RejectedCalls
from store.calls import WrittenCall, write_calls
from store.db import ping
from store.records import CallRecord

log = logging.getLogger("rlproxy.writer")

AfterWrite = Callable[[AsyncSession, list[WrittenCall]], Awaitable[None]]


class Batches:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], metrics: ProxyMetrics, rejected: RejectedCalls,
                 after_write: AfterWrite | None = None) -> None:
        self.sessions = sessions
        self.metrics = metrics
        self.rejected = rejected
        self.after_write = after_write
        self.database_ok = True
        self.slow: dict[str, int] = {}  # calls that timed out on their own while a lighter copy did not: how often
        # Calls set aside since the caller last asked (`take_kept`), also by a write that failed afterwards (a
        # split batch whose other half met an outage): the caller must not hand them over again.
        self.kept: list[CallRecord] = []

    def take_kept(self) -> set[str]:
        """The ids of the calls set aside in the rejected file since the last call."""
        kept, self.kept = {r.id for r in self.kept}, []
        return kept

    def _set_aside(self, record: CallRecord, reason: str) -> None:
        self.rejected.keep(record, reason)
        self.kept.append(record)

    async def write(self, records: list[CallRecord], *, may_repeat: bool = True) -> bool:
        """Store one batch. False when the database is unreachable (the caller spools). A batch the database
        rejects for what it contains is split so one bad record cannot block the rest; a record rejected on
        its own goes to the `.rejected.jsonl` file next to the spool, kept for inspection. A batch that runs past
        the database's statement timeout is split the same way (see `_write_slow`). `may_repeat=False` only for a
        first attempt: every retry (a split, a replay) looks up what an earlier attempt may have stored."""
        try:
            await self._transaction(records, may_repeat)
        except Exception as exc:  # noqa: BLE001 — classified below; nothing is dropped either way
            self.metrics.write_errors.inc()
            if _timed_out(exc) and await self._database_answers():
                return await self._write_slow(records, exc)
            if not _is_transient(exc) and await self._database_answers():
                return await self._write_rejected(records, exc)
            if self.database_ok:
                log.error("writing %d calls failed (%s: %s); spooling until the database answers",
                          len(records), type(exc).__name__, exc)
            self.database_ok = False
            return False
        if self.slow:
            for record in records:
                self.slow.pop(record.id, None)
        if not self.database_ok:
            log.info("database answers again")
        self.database_ok = True
        return True

    async def _database_answers(self) -> bool:
        """Whether a failure could be the database refusing the data: only if it still answers at all (a
        server shutting down fails statements in ways that look like data errors)."""
        try:
            async with asyncio.timeout(3), self.sessions() as session:
                await ping(session)
            return True
        except Exception:  # noqa: BLE001 — any failure means it does not
            return False

    async def _transaction(self, records: list[CallRecord], may_repeat: bool) -> None:
        began = time.perf_counter()
        pruned: list[CallRecord] = []
        foreign: list[CallRecord] = []
        async with self.sessions() as session, session.begin():
            written = await write_calls(session, records, may_repeat=may_repeat, pruned=pruned, foreign=foreign)
            if self.after_write is not None and written:
                await self.after_write(session, written)
        for record in pruned:  # after the commit: a retried batch would find them again
            self._set_aside(record, f"its rollout {record.rollout_id} was pruned (rlproxy prune, the trainer's "
                                       "retention) while the call waited in the spool; not stored")
        for record in foreign:
            self.metrics.foreign_calls.inc()
            self._set_aside(record, f"its rollout {record.rollout_id} belongs to another project (pruned and opened "
                                       f"again by it); a call of project {record.project!r} is not stored there")
        self.metrics.writer_batch.observe(len(records))
        self.metrics.writer_flush.observe(time.perf_counter() - began)
        self.metrics.rows_written.inc(len(written))
        if late := sum(item.late for item in written):
            self.metrics.late_calls.inc(late)
            log.warning("%d calls stored after their rollout was trained (raise the trainer's settle_s)", late)
        for item in written:
            if item.prefix_kind is not None:
                self.metrics.prefix_links.labels(item.prefix_kind).inc()

    async def _write_rejected(self, records: list[CallRecord], exc: Exception) -> bool:
        if len(records) > 1:
            middle = len(records) // 2
            return await self.write(records[:middle]) and await self.write(records[middle:])
        self._set_aside(records[0], f"storing it failed, on its own: {type(exc).__name__}: {exc}")
        return True

    async def _write_slow(self, records: list[CallRecord], exc: Exception) -> bool:
        """A batch ran past the statement timeout while the database answers: split it, oldest half first (the
        calls ahead of a slow one are stored; order holds because a failed half stops the rest). A call that
        times out alone is the slow one only if a copy of it without its bodies and token ids is stored in time
        (in a transaction rolled back): otherwise the database itself is slow, or a lock holds every write, and
        the call waits like in any outage. After `SLOW_ATTEMPTS` such timeouts it is set aside, so it cannot
        hold up every call behind it for good."""
        if len(records) > 1:
            middle = len(records) // 2
            return await self.write(records[:middle]) and await self.write(records[middle:])
        record = records[0]
        if not await self._lighter_copy_fits(record):
            self.database_ok = False
            return False
        self.slow[record.id] = attempts = self.slow.get(record.id, 0) + 1
        if attempts < SLOW_ATTEMPTS:
            log.warning("call %s ran past the database's statement timeout on its own (%d of %d tries)", record.id,
                        attempts, SLOW_ATTEMPTS)
            return False
        del self.slow[record.id]
        self._set_aside(record, f"storing it ran past the database's statement timeout {attempts} times on its "
                                   f"own, while the same call without its bodies was stored in time: "
                                   f"{type(exc).__name__}: {exc}")
        return True

    async def _lighter_copy_fits(self, record: CallRecord) -> bool:
        """Whether the call without its request, response, token ids and choices is stored within the timeout
        (in a transaction that is rolled back: nothing is kept)."""
        light = dataclasses.replace(record, request=None, response=None, prompt_token_ids=None, choices=[])
        try:
            async with self.sessions() as session:
                async with session.begin() as transaction:
                    await write_calls(session, [light])
                    await transaction.rollback()
        except Exception as exc:  # noqa: BLE001 — anything but a success says the database is the slow part
            log.info("a light copy of call %s was not stored in time either (%s): the database is slow",
                     record.id, type(exc).__name__)
            return False
        return True


# SQLSTATE classes that mean "this row cannot be stored as it is": data exceptions (a NUL in text, a number out of
# range), integrity violations, program limits (a row too large). Every other class is the database's state, not
# the call's: disk full (53), read-only after a failover (25006), statement timeout or cancel (57), deadlock or
# serialization (40), too many connections (53300). Those calls wait in the spool like in any outage.
REFUSED_FOR_DATA = frozenset({"22", "23", "54"})
QUERY_CANCELED = "57014"  # what Postgres answers when a statement runs past `statement_timeout`
SLOW_ATTEMPTS = 3  # times a call alone runs past the statement timeout before it is set aside


def _sqlstate(exc: BaseException) -> str | None:
    orig = getattr(exc, "orig", None)
    state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return str(state) if state else None


def _timed_out(exc: BaseException) -> bool:
    """The statement ran past the database's `statement_timeout` (a lock's own `lock_timeout`, 55P03, is not
    this: it says nothing about the call's size)."""
    return isinstance(exc, DBAPIError) and _sqlstate(exc) == QUERY_CANCELED


def _is_transient(exc: BaseException) -> bool:
    """Failures of reaching or of the state of the database (retry later), as opposed to the database refusing
    the data. By default a database error is transient: a call acknowledged to its client is set aside only when
    the database names its data as the reason."""
    if isinstance(exc, (OSError, asyncio.TimeoutError, OperationalError, InterfaceError)):
        return True
    if not isinstance(exc, DBAPIError):
        return False  # raised before the database saw the call: it could not be encoded (JSON, text)
    if exc.connection_invalidated:
        return True
    state = _sqlstate(exc)
    if state:
        return str(state)[:2] not in REFUSED_FOR_DATA
    # no SQLSTATE (SQLite; an error the driver raised before sending): refused only when it names the data
    return not isinstance(exc, (IntegrityError, DataError)) and not isinstance(exc.orig, (ValueError, TypeError))
