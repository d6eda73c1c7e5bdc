"""Reading the spool's lines back: how many a segment holds, and each as a call, a whole line this proxy cannot
read (another version's call: kept, raw, in the rejected file), or a line torn when the process was killed."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import orjson

from store.records import CallRecord

log = logging.getLogger("rlproxy.spool")


def count_lines(path: Path) -> int:
    """Lines in a segment; a torn last line without its newline counts (it is skipped when read)."""
    count, last = 0, b"\n"
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            count += chunk.count(b"\n")
            last = chunk[-1:]
    return count + (last != b"\n")


@dataclass(frozen=True)
class Unreadable:
    """A whole spool line (it ends in a newline: not torn at a crash) that is not a call this proxy can read: one
    written by another version of it. It is kept in the rejected file, raw, rather than dropped."""
    line: bytes
    reason: str


def parse_line(line: bytes) -> CallRecord | Unreadable | None:
    try:
        return CallRecord.from_json(orjson.loads(line))
    except (orjson.JSONDecodeError, TypeError, KeyError, ValueError) as exc:
        if line.endswith(b"\n"):
            return Unreadable(line, f"a spool line this proxy cannot read: {type(exc).__name__}: {exc}")
        log.error("skipping a torn spool line (written when the process was killed)")
        return None
