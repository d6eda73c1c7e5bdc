"""Calls that cannot be stored, set aside one per line in `<spool>.rejected.jsonl` with the reason, so that one
bad call never holds up or stops the recording of the others.

A line is `{"reason": str, "call": {...}}`, the call as the spool writes it (proxy/recording/lines.py). A call
that cannot be written as JSON at all (nested past what orjson writes, a string with a lone surrogate) is written in a safe form instead:
strings with such characters escaped as `\\udcff` text, levels past `KEPT_LEVELS` replaced by a marker. Keeping a
call must never fail in a way that reaches the writer: the last resort is a log line with the call's id.
"""
from __future__ import annotations

import dataclasses
import datetime
import logging
import os
from pathlib import Path
from typing import Any

import orjson

from core.text import printable
from proxy.metrics import ProxyMetrics
from store.records import CallRecord

log = logging.getLogger("rlproxy.writer")

KEPT_LEVELS = 200  # below orjson's 254 and far below Python's recursion limit
DEEPER = "(nested deeper than this: not kept)"
MAX_REASON = 2000  # a database's message can quote the whole statement


class RejectedCalls:
    def __init__(self, path: Path, metrics: ProxyMetrics, max_bytes: int | None = None) -> None:
        self.path = path
        self.metrics = metrics
        # Any key can make a call the database refuses (a NUL in its text): without a bound, one client could
        # fill the disk the spool and the database share, a 16 MiB call at a time.
        self.max_bytes = max_bytes

    def keep(self, record: CallRecord, reason: str) -> None:
        """Set `record` aside with `reason`; never raises."""
        self.metrics.rows_rejected.inc()
        reason = reason if len(reason) <= MAX_REASON else reason[:MAX_REASON] + "…"
        call_id = _text(getattr(record, "id", "?"))
        # the reason quotes what the database said of the call's content: escaped in the log, whole in the file
        log.error("call %s cannot be stored (%s); kept in %s", printable(call_id, 128), printable(reason), self.path)
        try:
            line = _line(record, reason)
            if self.max_bytes is not None and _size(self.path) + len(line) > self.max_bytes:
                log.error("call %s is not kept either: %s would pass its %d bytes (--rejected-max-bytes)", call_id,
                          self.path, self.max_bytes)
                return
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, line)  # one write: a line is whole or absent
            finally:
                os.close(fd)
        except Exception as exc:  # noqa: BLE001 — the disk is full or the file unwritable: the log has the id
            log.error("call %s could not be written to %s either (%s: %s): it is lost", call_id, self.path,
                      type(exc).__name__, exc)

    def keep_line(self, line: bytes, reason: str) -> None:
        """Set aside a spool line no call could be read from, as its text; never raises."""
        self.keep(_Raw(id="?", spool_line=line.decode("utf-8", "replace").rstrip("\n")), reason)

    def sync(self) -> None:
        """Make what was kept durable; never raises. Called before the spool blanks the lines of the calls kept
        (`Spool.set_aside`): a machine crash must not keep the blank and lose the kept copy."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return  # nothing was written (the disk refused, or the bound was reached): logged already
        try:
            os.fsync(fd)
        except OSError as exc:
            log.error("could not sync %s: %s", self.path, exc)
        finally:
            os.close(fd)


@dataclasses.dataclass
class _Raw:  # what the rejected file holds for a line that was never read as a call
    id: str
    spool_line: str


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _line(record: CallRecord, reason: str) -> bytes:
    try:
        return orjson.dumps({"reason": reason, "call": record}) + b"\n"
    except TypeError:
        pass
    try:
        return orjson.dumps({"reason": _text(reason), "call": _safe(record, 0)}) + b"\n"
    except Exception:  # noqa: BLE001 — not even the safe form: keep the id
        return orjson.dumps({"reason": _text(reason), "call": {"id": _text(getattr(record, "id", "?"))}}) + b"\n"


def _safe(value: Any, depth: int) -> Any:
    """`value` as something orjson always writes."""
    if isinstance(value, str):
        return _text(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if depth >= KEPT_LEVELS:
        return DEEPER
    if isinstance(value, dict):
        return {_text(str(key)): _safe(item, depth + 1) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_safe(item, depth + 1) for item in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _safe(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value)}
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    return _text(repr(value)[:1000])


def _text(value: Any) -> str:
    """A string with every character UTF-8 can hold, the others (lone surrogates) written as escapes."""
    return str(value).encode("utf-8", "backslashreplace").decode("utf-8")
