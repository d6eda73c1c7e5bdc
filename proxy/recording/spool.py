"""The spool: calls not in the database yet, as JSON lines in append-only segment files on local disk.

- `write()` appends records at once (in the page cache: they survive the process being killed) and numbers
  them (a log sequence number, lsn: one per line, across segments). `flush()` waits until everything written
  so far is durable (fdatasync). One flusher thread syncs back to back while anyone waits (group commit):
  whoever arrives during an fsync is covered by the next one, so many calls share one disk flush, and the
  pace of fsyncs does not depend on how busy the event loop is.
- `retire()` marks records the database has taken. A segment is deleted once it is sealed (the active one is
  sealed when it grows past `segment_bytes`) and holds no live record.
- Segments left by an earlier process are read back at start and all their records are live again: replaying
  them is idempotent by call id. A torn last line (a crash in the middle of a write, never acknowledged) is
  skipped.

A small volume stays usable (proxy/recording/space.py): a segment's size is bounded by the free space, nothing is
preallocated, and a segment whose records are all in the database is deleted when the disk refuses an append.

Files: `<path>` is the first segment, then `<path>.1`, `<path>.2`, … in order; numbering starts again once
every segment is gone. `<path>.lock` is held while a process uses the spool (proxy/recording/lock.py): a second
process on the same path is refused.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from core.errors import RlproxyError
import proxy.recording.lock as spool_lock
from proxy.recording.lines import Unreadable, blank_lines, count_lines, encode, parse_line
from proxy.recording.space import FAILURE_HOLD_S, FULL, probe, segment_limit
from store.records import CallRecord

log = logging.getLogger("rlproxy.spool")


class SpoolInUse(RlproxyError):
    """Another process holds the spool."""


OnFsync = Callable[[int, float], None]
"""Called after each fsync with the number of records it made durable and its duration in seconds."""


@dataclass(slots=True, eq=False)
class Segment:
    path: Path
    number: int
    first: int  # lsn of its first line
    count: int = 0  # lines in it
    live: int = 0  # lines the database has not taken yet
    size: int = 0  # bytes written
    synced: int = 0  # bytes known to be on disk
    fd: int | None = None  # open while records may be appended to it or still need their fsync
    new: bool = False  # its directory entry still needs an fsync
    sealed: bool = False
    limit: int = 0  # the size at which it is sealed (`segment_bytes`, less on a volume with little free space)


class Spool:
    def __init__(self, path: Path, *, segment_bytes: int = 4 << 20, retain_active: bool = False,
                 on_fsync: OnFsync | None = None) -> None:
        """`retain_active`: keep the active segment when its last record is retired (when every call is
        spooled, re-creating it each time would cost a directory fsync per call)."""
        self.path = path
        self.segment_bytes = segment_bytes
        self.retain_active = retain_active
        self.on_fsync = on_fsync
        self.segments: list[Segment] = []
        self.live: set[int] = set()
        self.next_lsn = 0
        self.durable_lsn = 0  # every lsn below it is on disk
        # Segment files and sizes are shared with the flusher thread: changed and read under this lock.
        self._lock = threading.Lock()
        self._waiters: list[tuple[int, int, asyncio.Future]] = []  # a heap of (lsn to reach, tie, future)
        self._tie = itertools.count()
        self._wanted = threading.Event()
        self._flusher: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._lock_fd = spool_lock.take(path)
        if self._lock_fd is None:
            raise SpoolInUse(f"another process uses the spool {path}: give each proxy its own --spool-path")
        self.failure: str | None = None  # why the last append failed; None once one succeeds
        self._failed_at = 0.0
        self._load()

    @property
    def pending(self) -> int:
        """Records in the spool the database has not taken yet."""
        return len(self.live)

    def problem(self) -> str | None:
        """Why the spool cannot take calls now, or None: an append failed in the last `FAILURE_HOLD_S` seconds
        (and none succeeded since), or `proxy.spool_space.probe` finds its volume full or its directory
        unwritable. Touches the disk: call it off the event loop."""
        if self.failure is not None and time.monotonic() - self._failed_at < FAILURE_HOLD_S:
            return f"appending to the spool failed: {self.failure}"
        return probe(self.path)

    def _load(self) -> None:
        for number, path in self._existing():
            count = count_lines(path)
            size = path.stat().st_size
            segment = Segment(path, number, self.next_lsn, count=count, live=count, size=size, synced=size,
                              sealed=True)
            self.segments.append(segment)
            self.live.update(range(self.next_lsn, self.next_lsn + count))
            self.next_lsn += count
            self._drop_if_done(segment)
        self.durable_lsn = self.next_lsn
        if self.live:
            log.warning("%d calls in the spool from an earlier run (%s); replaying them", len(self.live),
                        self.path)

    def _existing(self) -> list[tuple[int, Path]]:
        found = [(0, self.path)] if self.path.exists() else []
        prefix = self.path.name + "."
        if self.path.parent.is_dir():
            for candidate in self.path.parent.iterdir():
                suffix = candidate.name[len(prefix):]
                if candidate.name.startswith(prefix) and suffix.isdigit():
                    found.append((int(suffix), candidate))
        return sorted(found)

    def batches(self, size: int, upto: int, max_bytes: int | None = None,
                ) -> Iterator[list[tuple[int, CallRecord | Unreadable | None]]]:
        """The live records numbered below `upto`, oldest first, as (lsn, record); a whole line that cannot be
        read comes as (lsn, Unreadable), a torn one as (lsn, None). A batch holds at most `size` records and, past
        its first, no more than `max_bytes` of lines: calls of megabytes each are not read `size` at a time."""
        batch: list[tuple[int, CallRecord | Unreadable | None]] = []
        held = 0
        for segment in list(self.segments):
            if segment.first >= upto:
                break
            if not segment.live:
                continue
            with segment.path.open("rb") as fh:
                for lsn, line in zip(range(segment.first, min(upto, segment.first + segment.count)), fh):
                    if lsn not in self.live:
                        continue
                    if batch and max_bytes is not None and held + len(line) > max_bytes:
                        yield batch
                        batch, held = [], 0
                    batch.append((lsn, parse_line(line)))
                    held += len(line)
                    if len(batch) >= size:
                        yield batch
                        batch, held = [], 0
        if batch:
            yield batch

    def write(self, records: list[CallRecord]) -> range:
        """Append `records` (not durable yet: see `flush`); returns their lsns. Raises TypeError for a record
        JSON cannot hold (see `proxy.recording.lines.encode`), before anything is written."""
        return self.write_lines([encode(r) for r in records])

    def write_lines(self, lines: list[bytes]) -> range:
        """Append records already encoded, one line each, with one write() (the kernel has them once it
        returns: they survive the process being killed); returns their lsns."""
        data = b"".join(lines)
        with self._lock:
            try:
                segment = self._append(data)
            except OSError as exc:
                self.failure, self._failed_at = str(exc), time.monotonic()
                raise
            self.failure = None
            lsns = range(self.next_lsn, self.next_lsn + len(lines))
            segment.count += len(lines)
            segment.live += len(lines)
            segment.size += len(data)
            self.next_lsn = lsns.stop
        self.live.update(lsns)
        return lsns

    async def append(self, records: list[CallRecord]) -> range:
        """Append `records` and wait until they are on disk."""
        return await self.append_lines([encode(r) for r in records])

    async def append_lines(self, lines: list[bytes]) -> range:
        lsns = self.write_lines(lines)
        await self.flush(lsns.stop)
        return lsns

    def _append(self, data: bytes) -> Segment:
        """Write `data` at the end of the active segment, whole or not at all; returns the segment. When the
        disk refuses it and the segment holds only records the database has taken (with `retain_active` the
        active segment keeps them), the segment is deleted and the write goes to a new one."""
        segment = self._active()
        try:
            _write_all(segment, data)
        except OSError as exc:
            if exc.errno not in FULL or segment.live or not segment.size:
                raise
            log.warning("the spool's disk refused an append (%s): deleting %s, whose calls are all in the "
                        "database, and starting a new segment", exc, segment.path)
            self._seal(segment)
            segment = self._active()
            _write_all(segment, data)
        return segment

    def _active(self) -> Segment:
        segment = self.segments[-1] if self.segments and not self.segments[-1].sealed else None
        if segment is not None and segment.size >= segment.limit:
            self._seal(segment)
            segment = None
        if segment is None:
            number = self.segments[-1].number + 1 if self.segments else 0
            path = self.path if number == 0 else self.path.with_name(f"{self.path.name}.{number}")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)
            limit = segment_limit(self.segment_bytes, path.parent)
            segment = Segment(path, number, self.next_lsn, fd=fd, new=True, limit=limit)
            self.segments.append(segment)
        return segment

    def _seal(self, segment: Segment) -> None:
        segment.sealed = True
        if segment.synced >= segment.size:
            self._close_fd(segment)
        self._drop_if_done(segment)

    async def flush(self, upto: int | None = None) -> None:
        """Return once every record numbered below `upto` (default: all written so far) is on disk."""
        target = self.next_lsn if upto is None else upto
        if self.durable_lsn >= target:
            return
        self._loop = asyncio.get_running_loop()
        waiter = self._loop.create_future()
        heapq.heappush(self._waiters, (target, next(self._tie), waiter))
        if self._flusher is None:
            # After each fsync the flusher needs the GIL back to wake the loop; with the default 5 ms switch
            # interval it can wait that long behind a busy loop thread (the writer), longer than the fsync.
            sys.setswitchinterval(min(sys.getswitchinterval(), 0.0005))
            self._closing = False
            self._flusher = threading.Thread(target=self._flush_forever, name="spool-flusher", daemon=True)
            self._flusher.start()
        self._wanted.set()
        await waiter

    def _flush_forever(self) -> None:
        """The flusher thread: while anyone waits, sync what has been written, and tell the loop."""
        while True:
            self._wanted.wait()
            self._wanted.clear()
            if self._closing:
                return
            with self._lock:
                upto = self.next_lsn
                work = [(s, s.size, os.dup(s.fd)) for s in self.segments
                        if s.fd is not None and s.synced < s.size]
            error = None
            began = time.perf_counter()
            try:
                _sync([fd for _, _, fd in work], self.path.parent if any(s.new for s, _, _ in work) else None)
            except OSError as exc:
                error = exc
            finally:
                for _, _, fd in work:
                    os.close(fd)
            seconds = time.perf_counter() - began
            try:
                self._loop.call_soon_threadsafe(self._synced, upto, [(s, size) for s, size, _ in work], error,
                                                seconds)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                return

    def _synced(self, upto: int, work: list[tuple[Segment, int]], error: OSError | None,
                seconds: float) -> None:
        """On the loop, after an fsync: wake up the waiters it covered."""
        if error is not None:
            log.error("spool fsync failed: %s", error)
            while self._waiters and self._waiters[0][0] <= upto:
                _, _, waiter = heapq.heappop(self._waiters)
                if not waiter.done():
                    waiter.set_exception(error)
            return
        with self._lock:
            for segment, size in work:
                segment.synced = max(segment.synced, size)
                segment.new = False
                if segment.sealed and segment.synced >= segment.size:
                    self._close_fd(segment)
                    self._drop_if_done(segment)
        if self.on_fsync is not None and upto > self.durable_lsn:
            self.on_fsync(upto - self.durable_lsn, seconds)
        self.durable_lsn = max(self.durable_lsn, upto)
        while self._waiters and self._waiters[0][0] <= self.durable_lsn:
            _, _, waiter = heapq.heappop(self._waiters)
            if not waiter.done():
                waiter.set_result(None)

    def retire(self, lsns: Iterable[int]) -> None:
        """The database has taken these records."""
        segment = None
        touched = []
        for lsn in lsns:
            if lsn not in self.live:
                continue
            self.live.discard(lsn)
            if segment is None or not segment.first <= lsn < segment.first + segment.count:
                segment = self._segment_of(lsn)
                touched.append(segment)
            segment.live -= 1
        with self._lock:
            for segment in touched:
                if not segment.live and not segment.sealed and not self.retain_active:
                    self._seal(segment)
                else:
                    self._drop_if_done(segment)

    def set_aside(self, lsns: Iterable[int]) -> None:
        """These records are in the rejected file now: blank their lines (proxy/recording/lines.py) so that no later
        replay, in this process or after a restart, sets them aside again; then retire them."""
        lsns = sorted(lsn for lsn in set(lsns) if lsn in self.live)
        for segment, group in itertools.groupby(lsns, self._segment_of):
            try:
                blank_lines(segment.path, [lsn - segment.first for lsn in group])
            except OSError as exc:  # the next start may set them aside a second time; nothing is lost
                log.error("could not mark calls set aside in %s: %s", segment.path, exc)
        self.retire(lsns)

    def _segment_of(self, lsn: int) -> Segment:
        return next(s for s in self.segments if s.first <= lsn < s.first + s.count)

    def _drop_if_done(self, segment: Segment) -> None:
        if segment.sealed and not segment.live and segment in self.segments:
            # Every record in it is in the database: whether its last writes were ever fsynced no longer matters
            # (without `sync` durability they are not, unless the database was down).
            self._close_fd(segment)
            segment.path.unlink(missing_ok=True)
            self.segments.remove(segment)

    def _close_fd(self, segment: Segment) -> None:
        if segment.fd is not None:
            os.close(segment.fd)
            segment.fd = None

    async def close(self) -> None:
        """Flush, and delete what the database has taken; what it has not stays for the next start."""
        try:
            await self.flush()
        finally:
            self._closing = True
            self._wanted.set()
            if self._flusher is not None:
                await asyncio.to_thread(self._flusher.join, 5)
                self._flusher = None
            with self._lock:
                for segment in list(self.segments):
                    segment.sealed = True
                    self._close_fd(segment)
                    self._drop_if_done(segment)
            if self._lock_fd is not None:
                spool_lock.release(self.path, self._lock_fd)
                self._lock_fd = None


def _write_all(segment: Segment, data: bytes) -> None:
    """Append `data` to the segment's file; on failure, cut the file back so no half-written line is left."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(segment.fd, view):]
    except OSError:
        os.ftruncate(segment.fd, segment.size)
        raise


def _sync(fds: list[int], directory: Path | None) -> None:
    for fd in fds:
        os.fdatasync(fd)
    if directory is not None:  # a new segment's name must survive a crash too
        dir_fd = os.open(directory if str(directory) else ".", os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
