"""Replaying the spool's backlog into the database, oldest first, a bounded batch at a time (proxy/writer.py)."""
from __future__ import annotations

from collections.abc import Callable

from proxy.spool import Spool
from proxy.spool_lines import Unreadable
from proxy.transactions import Batches
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
        records = [r for _, r in batch if isinstance(r, CallRecord)]
        for _, unreadable in batch:
            if isinstance(unreadable, Unreadable):
                batches.rejected.keep_line(unreadable.line, unreadable.reason)
        if records and not await batches.write(records, may_repeat=True):
            return False, stored
        spool.retire(lsn for lsn, _ in batch)
        stored += len(records)
        after_batch()
    return True, stored
