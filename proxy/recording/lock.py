"""One process per spool: `<path>.lock` is held (a POSIX lock, released when the process ends, however it ends)
while a process uses the spool. A second process on the same path would replay, and delete, the first one's
records while it still writes them, so it is refused.

The file goes at a clean stop, and a lock file that is deleted needs care: a taker opens the file, then locks it,
and in between the holder may delete it and let go. The taker then holds a lock on a file no longer at the path,
while a third process creates a new one there and locks that: two owners of one spool. So the holder deletes the
file only while it still holds the lock, and a taker that got a lock checks that the file it locked is still the
one at the path, starting over when it is not. Whoever holds the lock on the file at the path is the only owner.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path


def lock_path(spool_path: Path) -> Path:
    return spool_path.with_name(spool_path.name + ".lock")


def take(spool_path: Path) -> int | None:
    """Hold the spool's lock file for this process; returns its descriptor, or None when another process holds
    it. (POSIX locks are per process: a second Spool on the same path in the same process, as tests make, is not
    refused.)"""
    path = lock_path(spool_path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # new folders and files: the owner's only
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        if _at_path(fd, path):
            return fd
        # The holder deleted the file between our open and our lock (its clean stop): the lock we got guards
        # nothing. Take the file at the path now, or be refused by whoever took it first.
        os.close(fd)


def release(spool_path: Path, fd: int) -> None:
    """Delete the lock file, then let go of it. In that order: until the lock is released nobody else can hold
    it, and whoever locks this file afterwards finds it gone from the path (`take`) and starts over."""
    lock_path(spool_path).unlink(missing_ok=True)
    os.close(fd)


def _at_path(fd: int, path: Path) -> bool:
    try:
        there = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)
