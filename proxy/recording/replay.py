"""Replaying the spool's backlog into the database, oldest first, a bounded batch at a time (for
proxy/recording/writer.py)."""
from __future__ import annotations

from collections.abc import Callable, Iterable

from proxy.recording.rejected import RejectedCalls
from proxy.recording.spool import Spool
from proxy.recording.lines import Unreadable
from proxy.recording.transactions import Batches
from store.records import CallRecord

# A replay batch is cut at this many bytes of spool lines as well as at `batch_size` calls: 256 calls of
# megabytes each (long contexts, images) would otherwise be read, decoded and sent as one transaction of gigabytes.
REPLAY_BATCH_BYTES = 16 << 20


async def replay(spool: Spool, batches: Batches, *, upto: int, count: int, max_bytes: int = REPLAY_BATCH_BYTES,
                 after_batch: Callable[[], None] = lambda: None) -> tuple[bool, int]:
    """Store the live records numbered below `upto`, retiring each batch once stored; lines no call can be read
    from go to the rejected file. Returns whether all were stored (False: the database stopped answering) and
    how many calls were. Every write may repeat an earlier one (a replay cut short by a crash)."""
    stored = 0
    for batch in spool.batches(count, upto, max_bytes):
        # What goes to the rejected file leaves the spool at once, whatever becomes of the rest of its batch: a
        # batch that fails is read again at the next retry, and its segment again at the next start.
        for lsn, item in batch:
            if isinstance(item, Unreadable):
                batches.rejected.keep_line(item.line, item.reason)
        set_aside(spool, batches.rejected, [lsn for lsn, item in batch if isinstance(item, Unreadable)])
        spool.retire(lsn for lsn, item in batch if item is None)  # torn or blanked: nothing to store
        records = [r for _, r in batch if isinstance(r, CallRecord)]
        try:
            ok = not records or await batches.write(records, may_repeat=True)
        finally:  # also when a stop cancels the write: what it set aside is in the rejected file already
            kept = batches.take_kept()
            set_aside(spool, batches.rejected,
                      [lsn for lsn, r in batch if isinstance(r, CallRecord) and r.id in kept])
        if not ok:
            return False, stored
        spool.retire(lsn for lsn, _ in batch)
        stored += len(records)
        after_batch()
    return True, stored


def set_aside(spool: Spool, rejected: RejectedCalls, lsns: Iterable[int]) -> None:
    """The calls at `lsns` are in the rejected file: make that durable, then take them out of the spool for good
    (`Spool.set_aside`). One fsync for them all; only calls that could not be stored come here."""
    lsns = list(lsns)
    if lsns:
        rejected.sync()
        spool.set_aside(lsns)
