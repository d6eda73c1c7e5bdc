"""What the writer (proxy/recording/writer.py) appends to the spool outside the request path: calls as lines (one
that JSON cannot hold is set aside instead), written from `submit` without waiting, and a call its agent is answered an
error for marked so (never trained on)."""
from __future__ import annotations

import asyncio
import logging

from core.errors import RlproxyError
from proxy.metrics import ProxyMetrics
from proxy.recording.lines import encode
from proxy.recording.rejected import RejectedCalls
from proxy.recording.spool import Spool
from store.models import CallStatus
from store.records import CallRecord

log = logging.getLogger("rlproxy.writer")


class SetAside(RlproxyError):
    """The call went to the rejected file instead (it cannot be written as JSON)."""


def spool_lines(records: list[CallRecord], rejected: RejectedCalls) -> list[bytes]:
    """The records as spool lines; one that cannot be written as JSON is set aside instead."""
    lines = []
    for record in records:
        try:
            lines.append(encode(record))
        except TypeError as exc:
            rejected.keep(record, f"cannot be written as JSON: {exc}")
    return lines


def spool_in_background(spool: Spool, rejected: RejectedCalls, metrics: ProxyMetrics,
                        records: list[CallRecord]) -> bool:
    """From `submit` (it cannot wait): written now, fsynced later; False when the disk refused them."""
    lines = spool_lines(records, rejected)
    if not lines:
        return True
    try:
        spool.write_lines(lines)
    except OSError as exc:
        log.error("could not append %d calls beyond the full queue to the spool %s: they are lost (%s)",
                  len(lines), spool.path, exc)
        return False
    metrics.rows_spooled.inc(len(lines))
    asyncio.ensure_future(spool.flush()).add_done_callback(_log_failure)
    return True


def mark_failed(record: CallRecord, reason: str) -> None:
    """The agent of this call is answered with an error: store it as failed, never as a trainable answer."""
    record.status = CallStatus.STORE_ERROR
    record.error = reason if record.error is None else f"{record.error}; {reason}"


def _log_failure(future: asyncio.Future) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("spool fsync failed: %s", future.exception())
