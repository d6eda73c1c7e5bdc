"""The capture writer: the only task that writes calls. Request handlers hand over a record and move on; the
writer drains a bounded queue and stores batches, one transaction each.

Durability (`WriterSettings.durability`; docs/durability.md): `spool` (the default) appends every call to the spool
with one write() before its agent is answered (it survives the proxy being killed), `sync` also fsyncs it (group
commit, proxy/recording/spool.py: it survives the machine crashing), `batch` answers first and spools only what
the database does not take (a killed proxy loses what was queued in memory).

Nothing accepted is dropped:
- the queue is full or a batch fails (the database is slow or down) → the calls wait in the spool;
- while the spool holds a backlog, new calls queue behind it, so calls reach the database in the order they
  were recorded; the backlog is replayed oldest first, each batch retired once stored. Writes are idempotent by
  call id (a replay cut short by a crash is replayed again; a call a replay took is skipped in memory).
- on shutdown, whatever is still queued is written, or left in the spool if the database does not answer.

Nothing one call contains stops the others: a call that cannot be written as JSON or that the database refuses
is set aside in the rejected file (proxy/recording/rejected.py); should the writer fail anyway, it is started again
(proxy/recording/supervisor.py) and stores the calls it had in hand one at a time, setting aside one that fails it again.
Those calls may have been stored just before the failure: they are written again with the look-up that skips
stored ones (`may_repeat`), ahead of the calls that came after them.

A spool's calls go to the database it was written for only (proxy/recording/identity.py); the backlog is replayed in
batches bounded by bytes as well as calls (proxy/recording/replay.py).
"""
from __future__ import annotations

import asyncio
import logging
import time

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from core.settings import WriterSettings
from proxy.errors import StoreUnavailable
from proxy.metrics import ProxyMetrics
from proxy.recording.lines import encode
from proxy.recording.rejected import RejectedCalls
from proxy.recording.replay import REPLAY_BATCH_BYTES, replay, set_aside
from proxy.recording.spool import Spool
from proxy.recording.identity import SpoolForeign, SpoolOwner
from proxy.recording.spooling import SetAside, mark_failed, spool_in_background, spool_lines
from proxy.recording.supervisor import Supervised
from proxy.recording.transactions import AfterWrite, Batches
from store.records import CallRecord

log = logging.getLogger("rlproxy.writer")

Item = tuple[CallRecord, int | None]  # a call and its spool lsn (None: only in memory)

RETRY_SECONDS = 1.0  # between replay attempts while the database does not answer


class CaptureWriter:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], settings: WriterSettings,
                 metrics: ProxyMetrics, after_write: AfterWrite | None = None) -> None:
        self.sessions = sessions
        self.settings = settings
        self.metrics = metrics
        self.after_write = after_write
        self.durable = settings.durability in ("spool", "sync")  # every call is in the spool before its answer
        self.fsync = settings.durability == "sync"  # ... and on disk
        self.queue: asyncio.Queue[Item | asyncio.Future | object] = asyncio.Queue(settings.queue_size)
        self.spool = Spool(settings.spool_path, segment_bytes=settings.spool_segment_bytes,
                           retain_active=self.durable, on_fsync=self._observe_fsync)
        self.rejected = RejectedCalls(settings.spool_path.with_suffix(".rejected.jsonl"), metrics,
                                      settings.rejected_max_bytes)
        self.backlog = self.spool.pending > 0  # calls wait in the spool with no copy in memory
        self.owner = SpoolOwner(settings.spool_path, sessions, leftover=self.spool.pending)
        self.replay_bytes = REPLAY_BATCH_BYTES
        self._dropped = False  # (durable) a spooled call's copy in memory was dropped since the replay began
        self._retry_at = 0.0
        self._task: asyncio.Task | None = None
        self._in_hand: list[Item] = []  # the batch being written
        self._markers: list[asyncio.Future] = []  # `sync()` waiters answered after that batch
        self._suspects: list[Item] = []  # in hand when the writer failed: stored one at a time
        self._spooled: set[str] = set()  # ids of calls in hand spooled since: a failure or stop must not respool
        self._supervisor = Supervised("capture writer", self._run, restarts=metrics.writer_restarts,
                                      up=metrics.writer_running, after_failure=self._after_failure)
        self.batches = Batches(sessions, metrics, self.rejected, after_write)
        self._gauges()

    async def start(self) -> None:
        """SpoolForeign when the spool holds calls for another database (they stay on disk)."""
        try:
            await self.owner.start()
        except SpoolForeign:
            await self.spool.close()
            raise
        self._task = self._supervisor.start()

    @property
    def running(self) -> bool:
        """Whether the writer is taking calls (false while it starts again after a failure, once closed, and
        while the spool's calls are for another database)."""
        return self._supervisor.running and self.owner.foreign is None

    @property
    def spooling(self) -> bool:
        """Whether calls are waiting in the spool for the database (it is down, or was too slow)."""
        return self.backlog

    @property
    def awaiting_replay(self) -> int:
        """Calls in the spool waiting for the database to take them again. (With `spool` and `sync` durability
        every call passes through the spool; those on their normal way to the database are not counted.)"""
        return self.spool.pending if self.backlog else 0

    def submit(self, record: CallRecord) -> int | None:
        """Hand a finished call to the writer; never waits, never raises. In `spool` and `sync` mode the call
        is appended to the spool first (see `commit`); returns its spool lsn, or None when it is only in
        memory."""
        return self._take(record)[1]

    async def commit(self, record: CallRecord) -> None:
        """`submit`; StoreUnavailable if `spool` or `sync` mode could not write the call to the spool. `sync` waits
        until it is on disk (one fsync shared with everyone's) before queueing it. A call that raises here is
        answered with an error, so it is stored as failed (`store_error`, never trained on)."""
        if not self.fsync:
            if not self._take(record)[0]:
                raise StoreUnavailable("the call could not be written to the spool")
            return
        try:
            lsn = self._append(record)
        except SetAside:
            return
        try:
            if lsn is None:
                raise StoreUnavailable("the call could not be written to the spool")
            await self.spool.flush(lsn + 1)
        except OSError as exc:
            self.spool.retire([lsn])  # its line says `ok`: the in-memory copy, marked failed, is the one stored
            mark_failed(record, f"the spool could not make it durable: {exc}")
            lsn = None
            raise StoreUnavailable(f"the call could not be made durable: {exc}") from None
        finally:
            self._queue(record, lsn)  # also when the agent left while it waited: it is recorded all the same

    def _take(self, record: CallRecord) -> tuple[bool, int | None]:
        """Queue the call (in `spool` and `sync` mode after appending it to the spool). Returns whether it is
        kept as the durability mode promises, and its lsn."""
        try:
            lsn = self._append(record) if self.durable else None
        except SetAside:
            return True, None
        self._queue(record, lsn)
        return not self.durable or lsn is not None, lsn

    def _append(self, record: CallRecord) -> int | None:
        """Append the call to the spool; its lsn, or None when the spool's disk refused it (the call is then
        marked failed: its agent is answered with an error). A call that cannot be written as JSON is set aside
        in the rejected file at once (`SetAside`): neither the spool nor the database could take it."""
        try:
            line = encode(record)
        except TypeError as exc:
            self.rejected.keep(record, f"cannot be written as JSON: {exc}")
            raise SetAside from None
        try:
            [lsn] = self.spool.write_lines([line])
        except OSError as exc:
            log.error("could not append call %s to the spool %s: %s", record.id, self.spool.path, exc)
            mark_failed(record, f"the spool could not keep it: {exc}")
            return None
        return lsn

    def _queue(self, record: CallRecord, lsn: int | None) -> None:
        try:
            self.queue.put_nowait((record, lsn))
        except asyncio.QueueFull:
            if lsn is None:
                self._overflow(record)
            self.backlog = self._dropped = True  # the writer replays it from the spool
        self._gauges()

    async def sync(self, timeout: float = 10.0) -> None:
        """Wait until every call submitted so far is in the database (read-your-writes for rewards)."""
        marker: asyncio.Future = asyncio.get_running_loop().create_future()
        await self.queue.put(marker)
        try:
            await asyncio.wait_for(asyncio.shield(marker), timeout)
        except asyncio.TimeoutError:
            raise StoreUnavailable("the database did not take recorded calls in time") from None

    async def close(self, timeout: float = 10.0) -> None:
        """Write what is queued within `timeout`; what the database did not take stays in the spool."""
        if self._task is None:
            return
        try:
            await asyncio.wait_for(self.queue.put(_STOP), timeout)
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except asyncio.TimeoutError:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            held = self._suspects + self._in_hand + self._drain_nowait()
            leftovers = [r for r, lsn in held if lsn is None and r.id not in self._spooled]  # not in the spool
            await self._spool(leftovers)
            log.warning("the database did not take every call in time: %d left in the spool for the next "
                        "start", self.spool.pending)
        finally:
            self._task = None
            await self.spool.close()
            self.owner.release(spool_empty=not self.spool.segments)
            self._gauges()

    def _drain_nowait(self) -> list[Item]:
        items = []
        while not self.queue.empty():
            item = self.queue.get_nowait()
            if isinstance(item, tuple):
                items.append(item)
            elif isinstance(item, asyncio.Future) and not item.done():
                item.set_exception(StoreUnavailable("the writer stopped"))
        return items

    async def _next_batch(self) -> tuple[list[Item], list[asyncio.Future], bool]:
        """Wait for work, then gather more for up to `flush_interval` or `batch_size` calls. What is queued
        already is taken at once: a timed wait (`asyncio.wait_for`, a task and a timer each) costs 20 us of the
        event loop, and was paid for every call the writer took."""
        items: list[Item] = []
        markers: list[asyncio.Future] = []
        stop = False
        timeout = RETRY_SECONDS if self.backlog else None  # with a backlog, wake up to retry the replay
        deadline = None
        while len(items) < self.settings.batch_size:
            try:
                if deadline is None:
                    item = await self._get(timeout)
                    deadline = time.monotonic() + self.settings.flush_interval
                else:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    item = await self._get(remaining)
            except asyncio.TimeoutError:
                break
            if item is _STOP:
                stop = True
                break
            if isinstance(item, asyncio.Future):
                markers.append(item)
                break  # answer the waiter promptly
            items.append(item)
        return items, markers, stop

    async def _get(self, timeout: float | None) -> Item | asyncio.Future | object:
        """The next item of the queue: at once when one is there, else within `timeout` (None: no limit)."""
        if not self.queue.empty():
            return self.queue.get_nowait()
        if timeout is None:
            return await self.queue.get()
        return await asyncio.wait_for(self.queue.get(), timeout)

    async def _run(self) -> None:
        await self._recover()
        while True:
            items, self._markers, stop = await self._next_batch()
            self._spooled.clear()  # no suspects are left (`_recover`), and the last batch was let go
            self._in_hand = items
            ok = await self._store(items, retry_now=bool(self._markers) or stop)
            self._in_hand = []
            self._gauges()
            self._answer_markers(ok)
            if stop:
                rest = self._in_hand = self._drain_nowait()
                if (rest or self.backlog) and not await self._store(rest, retry_now=True):
                    log.warning("database unavailable at shutdown: %d calls left in the spool",
                                self.spool.pending)
                self._in_hand = []
                return

    def _answer_markers(self, ok: bool) -> None:
        markers, self._markers = self._markers, []
        for marker in markers:
            if marker.done():
                continue
            if ok:
                marker.set_result(None)
            else:
                marker.set_exception(StoreUnavailable("the database is unavailable; calls are spooled"))

    async def _after_failure(self, exc: BaseException) -> None:
        """The writer failed with a batch in hand: its calls not in the spool are suspects (see `_recover`)."""
        self._suspects += [(r, lsn) for r, lsn in self._in_hand if lsn is not None or r.id not in self._spooled]
        self._in_hand = []
        self._gauges()

    async def _recover(self) -> None:
        """After a failure, before anything else: store the calls that were in hand one at a time, so that one
        that makes the writer fail again (a fault nothing else caught) is set aside, and the others are kept.
        Failures of the disk (OSError) say nothing about a call: the supervisor tries again later."""
        ok = True
        while self._suspects:
            record, lsn = self._suspects[0]
            try:  # it may have been stored before the failure: look it up first (`may_repeat`)
                ok = await self._store([(record, lsn)], retry_now=True, may_repeat=True) and ok
            except OSError:
                raise
            except Exception as exc:  # noqa: BLE001 — this call is what fails
                self.rejected.keep(record, f"the capture writer failed on it: {type(exc).__name__}: {exc}")
                set_aside(self.spool, self.rejected, [lsn] if lsn is not None else [])
            self._suspects.pop(0)
        self._answer_markers(ok)  # the `sync()` waiters of the failed batch

    async def _store(self, items: list[Item], *, retry_now: bool = False, may_repeat: bool = False) -> bool:
        """Write `items` behind any backlog; True when nothing is left waiting. `may_repeat`: an earlier attempt
        may have stored some of them (any retry); False only for a first attempt."""
        # A call a replay already stored (spool and sync mode: it was in the spool) is not written twice.
        items = [(r, lsn) for r, lsn in items if lsn is None or lsn in self.spool.live]
        if not await self.owner.ready():  # the database has not told who it is, or is not the spool's
            await self._spool([r for r, lsn in items if lsn is None])
            self.backlog = True
            self._retry_at = time.monotonic() + RETRY_SECONDS
            return False
        if self.backlog:
            await self._spool([r for r, lsn in items if lsn is None])  # spooled ones are there already
            if not retry_now and time.monotonic() < self._retry_at:
                return False
            return await self._replay()
        if not items:
            return True
        try:
            ok = await self.batches.write([r for r, _ in items], may_repeat=may_repeat)
        finally:
            kept = self._let_go_of_kept(items)
        if ok:
            self.spool.retire(lsn for _, lsn in items if lsn is not None)
            return True
        await self._spool([r for r, lsn in items if lsn is None and r.id not in kept])
        self.backlog = True
        self._retry_at = time.monotonic() + RETRY_SECONDS
        return False

    def _let_go_of_kept(self, items: list[Item]) -> set[str]:
        """The calls a write set aside, also one that failed afterwards: out of the spool and out of hand, so that
        no retry, respool or restart sets them aside again. Returns their ids."""
        kept = self.batches.take_kept()
        if kept:
            set_aside(self.spool, self.rejected, [lsn for r, lsn in items if r.id in kept and lsn is not None])
            self._in_hand = [item for item in self._in_hand if item[0].id not in kept]
        return kept

    async def _spool(self, records: list[CallRecord]) -> None:
        """Append calls only in memory to the spool, once each (see `_spooled`), and wait until they are on disk."""
        records = [r for r in records if r.id not in self._spooled]
        lines = spool_lines(records, self.rejected)
        if lines:
            await self.spool.append_lines(lines)
            self.metrics.rows_spooled.inc(len(lines))
        self._spooled.update(r.id for r in records)

    def _overflow(self, record: CallRecord) -> None:
        """A call only in memory meets a full queue: the batch in hand (older; its write may yet fail), the
        queued calls and this one go to the spool in the order they were recorded (queued calls with an lsn are
        there already: the replay takes them); waiters for `sync()` keep their place."""
        queued, others = [], []
        while not self.queue.empty():
            item = self.queue.get_nowait()
            (queued if isinstance(item, tuple) else others).append(item)
        # The calls a failed writer held (suspects) are older than the batch in hand, which is older than the queue.
        held = self._suspects + self._in_hand
        in_hand = [r for r, lsn in held if lsn is None and r.id not in self._spooled]
        if spool_in_background(self.spool, self.rejected, self.metrics,
                               in_hand + [r for r, lsn in queued if lsn is None] + [record]):
            self._spooled.update(r.id for r in in_hand)  # stored by its write or the replay, whichever is first
        for item in others:
            self.queue.put_nowait(item)

    async def _replay(self) -> bool:
        """Store the backlog, oldest first, retiring each batch once stored."""
        self._dropped = False
        ok, stored = await replay(self.spool, self.batches, upto=self.spool.next_lsn, count=self.settings.batch_size,
                                  max_bytes=self.replay_bytes, after_batch=self._gauges)
        if not ok:
            self._retry_at = time.monotonic() + RETRY_SECONDS
            return False
        # Calls spooled while the replay ran (queue full) are still waiting for the next one.
        self.backlog = self._dropped if self.durable else self.spool.pending > 0
        if stored:
            log.info("replayed %d spooled calls", stored)
        return True

    @property
    def database_ok(self) -> bool:
        return self.batches.database_ok

    def _observe_fsync(self, calls: int, seconds: float) -> None:
        self.metrics.spool_fsync.observe(seconds)
        self.metrics.spool_fsync_calls.observe(calls)

    def _gauges(self) -> None:
        self.metrics.spool_pending.set(self.awaiting_replay)
        self.metrics.spooling.set(1 if self.backlog else 0)
        self.metrics.writer_queue.set(self.queue.qsize())


_STOP = object()
