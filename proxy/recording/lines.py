"""The spool's line format, written and read here only: a line is one call, `store/records.py` `CallRecord` as
JSON (its on-disk format: a field renamed there makes the lines written before unreadable), ending in a newline.
Written by `encode`; read back by `parse_line` as a call, a whole line this proxy cannot read (another version's
call: kept, raw, in the rejected file), or a line torn when the process was killed; `count_lines` counts a segment.

A line whose call went to the rejected file is blanked where it is (`blank_lines`): spaces of the same length, so
every other line keeps its place and number. A segment outlives a failed replay and a stop while any of its calls
waits for the database; without the blank, each retry and each start would set the same line aside again."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import orjson

from store.records import CallRecord

log = logging.getLogger("rlproxy.spool")


def encode(record: CallRecord) -> bytes:
    """The call as one spool line. Raises TypeError (orjson.JSONEncodeError is one) for a call that JSON cannot
    hold as it is."""
    # orjson writes the dataclass as `CallRecord.to_json()` would, a hundred times faster (no asdict copy)
    return orjson.dumps(record) + b"\n"


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
    """The line's call; Unreadable; or None for a torn line and a blanked one (nothing to store)."""
    if line.endswith(b"\n") and not line.strip(b" \n"):
        return None  # set aside already
    try:
        return CallRecord.from_json(orjson.loads(line))
    except (orjson.JSONDecodeError, TypeError, KeyError, ValueError) as exc:
        if line.endswith(b"\n"):
            return Unreadable(line, f"a spool line this proxy cannot read: {type(exc).__name__}: {exc}")
        log.error("skipping a torn spool line (written when the process was killed)")
        return None


def blank_lines(path: Path, indexes: list[int]) -> None:
    """Overwrite the whole lines numbered `indexes` (from 0, ascending) of a segment with spaces, newline kept."""
    places, wanted = [], iter(indexes)
    target, offset = next(wanted, None), 0
    with path.open("rb") as fh:
        for index, line in enumerate(fh):
            if target is None:
                break
            if index == target:
                if line.endswith(b"\n"):  # a torn line has nothing to blank: it is never read as a call
                    places.append((offset, len(line)))
                target = next(wanted, None)
            offset += len(line)
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)  # not O_APPEND: that would write at the end, not in place
    try:
        for offset, length in places:
            os.pwrite(fd, b" " * (length - 1) + b"\n", offset)
    finally:
        os.close(fd)
