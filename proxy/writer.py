"""The capture writer: the only task that writes calls. Request handlers `submit()` a record and move on;
the writer drains a bounded queue and stores batches, one transaction each.

Nothing accepted is dropped:
- queue full (the database is slower than the traffic) → the record goes straight to the spool file;
- a batch fails (database down or slow) → the batch is appended to the spool file;
- while the spool holds anything, new batches are appended behind it, so calls reach the database in the
  order they were recorded; the spool is replayed oldest first once the database answers, and truncated
  only after every line is stored. Writes are idempotent by call id, so a replay interrupted by a crash is
  simply replayed again (exactly once).
- on shutdown, whatever is still queued is written, or spooled if the database does not answer.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Awaitable, Callable

import orjson
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from proxy.errors import StoreUnavailable
from proxy.metrics import ProxyMetrics
from rlproxy.settings import WriterSettings
from store.calls import WrittenCall, write_calls
from store.records import CallRecord

log = logging.getLogger("rlproxy.writer")

AfterWrite = Callable[[AsyncSession, list[WrittenCall]], Awaitable[None]]


class Spool:
    """An append-only JSON-lines file of call records waiting for the database."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pending = self._count()

    def _count(self) -> int:
        if not self.path.exists():
            return 0
        with self.path.open("rb") as fh:
            return sum(1 for line in fh if line.strip())

    def append(self, records: list[CallRecord]) -> None:
        data = b"".join(orjson.dumps(r.to_json()) + b"\n" for r in records)
        with self.path.open("ab") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        self.pending += len(records)

    def read(self) -> list[CallRecord]:
        if not self.path.exists():
            return []
        records = []
        with self.path.open("rb") as fh:
            for line in fh:
                if line.strip():
                    try:
                        records.append(CallRecord.from_json(orjson.loads(line)))
                    except (orjson.JSONDecodeError, TypeError, KeyError, ValueError):
                        log.error("skipping an unreadable spool line (a torn write at a crash?)")
        return records

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)
        self.pending = 0


class CaptureWriter:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], settings: WriterSettings,
                 metrics: ProxyMetrics, after_write: AfterWrite | None = None) -> None:
        self.sessions = sessions
        self.settings = settings
        self.metrics = metrics
        self.after_write = after_write
        self.queue: asyncio.Queue[CallRecord | asyncio.Future] = asyncio.Queue(settings.queue_size)
        self.spool = Spool(settings.spool_path)
        self.metrics.spool_pending.set(self.spool.pending)
        self._task: asyncio.Task | None = None
        self.database_ok = True

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="capture-writer")

    def submit(self, record: CallRecord) -> None:
        """Hand a finished call to the writer; never blocks the request."""
        try:
            self.queue.put_nowait(record)
        except asyncio.QueueFull:
            self.spool.append([record])
            self.metrics.rows_spooled.inc()
            self.metrics.spool_pending.set(self.spool.pending)
        self.metrics.writer_queue.set(self.queue.qsize())

    async def sync(self, timeout: float = 10.0) -> None:
        """Wait until every call submitted so far is in the database (read-your-writes for rewards)."""
        marker: asyncio.Future = asyncio.get_running_loop().create_future()
        await self.queue.put(marker)
        try:
            await asyncio.wait_for(asyncio.shield(marker), timeout)
        except asyncio.TimeoutError:
            raise StoreUnavailable("the database did not take recorded calls in time") from None

    async def close(self, timeout: float = 10.0) -> None:
        if self._task is None:
            return
        await self.queue.put(_STOP)
        try:
            await asyncio.wait_for(self._task, timeout)
        except asyncio.TimeoutError:
            self._task.cancel()
            leftovers = self._drain_nowait()
            if leftovers:
                self.spool.append(leftovers)
                log.warning("spooled %d calls at shutdown; they are replayed on the next start", len(leftovers))

    def _drain_nowait(self) -> list[CallRecord]:
        records = []
        while not self.queue.empty():
            item = self.queue.get_nowait()
            if isinstance(item, CallRecord):
                records.append(item)
            elif isinstance(item, asyncio.Future) and not item.done():
                item.set_exception(StoreUnavailable("the writer stopped"))
        return records

    async def _next_batch(self) -> tuple[list[CallRecord], list[asyncio.Future], bool]:
        """Wait for work, then gather more for up to `flush_interval` or `batch_size` records."""
        records: list[CallRecord] = []
        markers: list[asyncio.Future] = []
        stop = False
        timeout = None if not self.spool.pending else 1.0  # with a spool, wake up to retry the replay
        deadline = None
        while len(records) < self.settings.batch_size:
            try:
                if deadline is None:
                    item = await asyncio.wait_for(self.queue.get(), timeout)
                    deadline = time.monotonic() + self.settings.flush_interval
                else:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    item = await asyncio.wait_for(self.queue.get(), remaining)
            except asyncio.TimeoutError:
                break
            if item is _STOP:
                stop = True
                break
            if isinstance(item, asyncio.Future):
                markers.append(item)
                break  # answer the waiter promptly
            records.append(item)
        return records, markers, stop

    async def _run(self) -> None:
        while True:
            records, markers, stop = await self._next_batch()
            self.metrics.writer_queue.set(self.queue.qsize())
            ok = await self._store(records)
            for marker in markers:
                if marker.done():
                    continue
                if ok:
                    marker.set_result(None)
                else:
                    marker.set_exception(StoreUnavailable("the database is unavailable; calls are spooled"))
            if stop:
                rest = self._drain_nowait()
                if rest and not await self._store(rest):
                    log.warning("database unavailable at shutdown: %d calls left in the spool", self.spool.pending)
                return

    async def _store(self, records: list[CallRecord]) -> bool:
        """Write `records` behind anything spooled; True when nothing is left waiting."""
        if self.spool.pending:
            if records:
                self.spool.append(records)
                self.metrics.rows_spooled.inc(len(records))
            replayed = await self._replay()
            self.metrics.spool_pending.set(self.spool.pending)
            return replayed
        if not records:
            return True
        if await self._write(records, may_repeat=False):
            return True
        self.spool.append(records)
        self.metrics.rows_spooled.inc(len(records))
        self.metrics.spool_pending.set(self.spool.pending)
        return False

    async def _replay(self) -> bool:
        records = self.spool.read()
        for start in range(0, len(records), self.settings.batch_size):
            if not await self._write(records[start : start + self.settings.batch_size]):
                return False
        self.spool.clear()
        log.info("replayed %d spooled calls", len(records))
        return True

    async def _write(self, records: list[CallRecord], *, may_repeat: bool = True) -> bool:
        """Store one batch. False when the database is unreachable (the caller spools). A batch the database
        rejects for what it contains is split so one bad record cannot block the rest; a record rejected on
        its own goes to the `.rejected.jsonl` file next to the spool, kept for inspection."""
        try:
            await self._transaction(records, may_repeat)
        except Exception as exc:  # noqa: BLE001 — classified below; nothing is dropped either way
            self.metrics.write_errors.inc()
            if not _is_transient(exc):
                return await self._write_rejected(records, exc)
            if self.database_ok:
                log.error("writing %d calls failed (%s: %s); spooling until the database answers",
                          len(records), type(exc).__name__, exc)
            self.database_ok = False
            return False
        if not self.database_ok:
            log.info("database answers again")
        self.database_ok = True
        return True

    async def _transaction(self, records: list[CallRecord], may_repeat: bool) -> None:
        began = time.perf_counter()
        async with self.sessions() as session, session.begin():
            written = await write_calls(session, records, may_repeat=may_repeat)
            if self.after_write is not None and written:
                await self.after_write(session, written)
        self.metrics.writer_batch.observe(len(records))
        self.metrics.writer_flush.observe(time.perf_counter() - began)
        self.metrics.rows_written.inc(len(written))
        for item in written:
            if item.prefix_kind is not None:
                self.metrics.prefix_links.labels(item.prefix_kind).inc()

    async def _write_rejected(self, records: list[CallRecord], exc: Exception) -> bool:
        if len(records) > 1:
            middle = len(records) // 2
            return await self._write(records[:middle]) and await self._write(records[middle:])
        log.error("the database rejected call %s (%s: %s); kept in %s", records[0].id, type(exc).__name__, exc,
                  self.rejected_path)
        with self.rejected_path.open("ab") as fh:
            fh.write(orjson.dumps(records[0].to_json()) + b"\n")
        self.metrics.rows_rejected.inc()
        return True

    @property
    def rejected_path(self) -> Path:
        return self.settings.spool_path.with_suffix(".rejected.jsonl")


def _is_transient(exc: BaseException) -> bool:
    """Failures of reaching the database (retry later), as opposed to the database refusing the data."""
    if isinstance(exc, (OSError, asyncio.TimeoutError, OperationalError, InterfaceError)):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


_STOP = object()
