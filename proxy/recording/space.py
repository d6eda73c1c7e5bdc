"""Whether the spool's volume can take calls, and how large a segment it can afford (proxy/recording/spool.py).

The active segment keeps the records the database has taken until it is sealed (with `spool` and `sync`
durability every call passes through it), so its size is disk the spool holds on to: on a small volume a
segment size near the free space would fill it. Nothing is preallocated; a new segment is sealed at an eighth of
the space free when it was opened (never less than `MIN_SEGMENT_BYTES`, never more than the setting).
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

MIN_SEGMENT_BYTES = 64 << 10  # the smallest bound free space puts on a segment (when it is below the setting)
RESERVE_BYTES = 1 << 20  # `/readyz` says not ready when the spool's volume has less free than this
FAILURE_HOLD_S = 30.0  # a failed append keeps the spool reported unwritable this long, unless one succeeds
PROBE_BYTES = 4096  # what `probe` writes to see that the directory takes a file
FULL = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT})  # the disk (or a limit on it) refused more bytes


def free_bytes(directory: Path) -> int:
    """Bytes an unprivileged process may still write on the volume holding `directory`."""
    stats = os.statvfs(directory)
    return stats.f_bavail * stats.f_frsize


def segment_limit(configured: int, directory: Path) -> int:
    """The size at which a segment opened now is sealed: `configured`, bounded by an eighth of the free space."""
    try:
        free = free_bytes(directory)
    except OSError:
        return configured
    return min(configured, max(MIN_SEGMENT_BYTES, free // 8))


def probe(spool_path: Path) -> str | None:
    """Why the spool at `spool_path` cannot take calls, or None: its volume has less than `RESERVE_BYTES` free,
    or its directory refuses a small file (written next to it, then removed). Touches the disk."""
    directory = spool_path.parent if str(spool_path.parent) else Path(".")
    try:
        free = free_bytes(directory)
        if free < RESERVE_BYTES:
            return f"the spool's volume has {free} bytes free (less than {RESERVE_BYTES})"
        path = spool_path.with_name(spool_path.name + ".probe")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, bytes(PROBE_BYTES))
            finally:
                os.close(fd)
        finally:
            path.unlink(missing_ok=True)
    except OSError as exc:
        return f"the spool's directory {directory} cannot be written: {exc}"
    return None
