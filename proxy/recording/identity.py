"""Which database a spool's calls are for: its calls are replayed into that database only.

A spool outlives its process, and the next start may be given another `--database-url` (another environment,
a copy, a new server): replaying there would store one database's calls in another, numbered into rollouts of
the same ids. So next to the spool, `<path>.database` holds, as JSON, the database's identity (`store.calls.
database_identity`: Postgres' cluster id and the database's name, SQLite's file) and its address without the
password, written when the spool is first used and completed once the database first answers.

At start, calls left by an earlier run are replayed only into the database the file names. Another one is refused
with `SpoolForeign` (the calls stay on disk: start the proxy with the database the file names, or, to store them in
this one, delete the file). When the database does not answer at start, the check waits for it: until it passes
nothing is written there, and if it fails then the writer stops taking calls into the database (`/readyz` says
the writer is down; calls still go to the spool). A spool left by a version without the file is taken as this
database's. The file is deleted with the spool's last segment, on a clean stop.
"""
from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import orjson
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from proxy.recording.spool import SpoolInUse
from store.calls import database_identity

log = logging.getLogger("rlproxy.spool")

START_CHECK_S = 5.0  # how long a start waits for the database to tell its identity before going on without


class SpoolForeign(SpoolInUse):
    """The spool holds calls written for another database: this proxy cannot use it as it is."""


class SpoolOwner:
    def __init__(self, spool_path: Path, sessions: async_sessionmaker[AsyncSession], *, leftover: int) -> None:
        """`leftover`: calls in the spool from an earlier run (they are the ones that must not go astray)."""
        self.spool_path = spool_path
        self.path = spool_path.with_name(spool_path.name + ".database")
        self.sessions = sessions
        self.address = _address(sessions)
        self.leftover = leftover
        self.identity: str | None = None  # this database's, once read
        self.verified = False  # the spool's calls may be written to this database
        self.foreign: str | None = None  # why they may not (found after the start)

    async def start(self) -> None:
        """Check the leftover calls are for this database (SpoolForeign when not), and claim the spool for it.
        A spool without leftover calls is claimed at once: the identity is read when the database first
        answers (`ready`), so a start never waits for it."""
        marker = _read(self.path)
        if not self.leftover or marker is None:
            if self.leftover:
                log.warning("the spool %s holds %d calls from a version that did not record their database: "
                            "they are stored in this one (%s)", self.spool_path, self.leftover, self.address)
            self.verified = True
            self._write()
            return
        try:
            async with asyncio.timeout(START_CHECK_S):
                await self._read_identity()
        except Exception as exc:  # noqa: BLE001 — the database does not answer yet: checked once it does
            log.info("the database did not tell its identity at start (%s: %s)", type(exc).__name__, exc)
        mismatch = self._mismatch(marker)
        if mismatch:
            raise SpoolForeign(mismatch)
        if self.identity is not None or marker.get("identity") is None:
            self.verified = True
            self._write()

    async def ready(self) -> bool:
        """Whether the spool's calls may be written now; reads the identity once the database answers. False
        while the database has not told it, and while it differs (`foreign`; deleting the file lets them go)."""
        if self.verified and self.identity is not None:
            return True
        try:
            await self._read_identity()
        except Exception:  # noqa: BLE001 — unreachable: the caller tries again later, as with any write
            return self.verified
        if not self.verified:
            marker = _read(self.path)
            mismatch = self._mismatch(marker) if marker is not None else None
            if mismatch is not None:
                if self.foreign is None:
                    log.error("%s", mismatch)
                self.foreign = mismatch
                return False
            self.foreign = None
            self.verified = True
        self._write()
        return True

    def release(self, spool_empty: bool) -> None:
        """On a clean stop: the file goes with the spool's last segment."""
        if spool_empty:
            self.path.unlink(missing_ok=True)

    async def _read_identity(self) -> None:
        if self.identity is None:
            async with self.sessions() as session:
                self.identity = await database_identity(session) or f"address:{self.address}"

    def _mismatch(self, marker: dict) -> str | None:
        """Why the spool's calls are not for this database, or None. Its identity decides once both are known;
        before the spool's database ever answered, only its address is known."""
        theirs, address = marker.get("identity"), marker.get("address")
        if theirs is not None:
            if self.identity is None or self.identity == theirs:
                return None
        elif address == self.address:
            return None
        return (f"the spool {self.spool_path} holds {self.leftover} calls written for the database {address} "
                f"({theirs or 'never reached'}), not this one, {self.address} ({self.identity or 'not reached'}): "
                f"they are not stored here. Start the proxy with that database, or delete {self.path} to store "
                f"them in this one")

    def _write(self) -> None:
        """Write the file (whole: a temporary file renamed over it); a disk that refuses it is logged, and the
        check goes by what the file said before."""
        data = orjson.dumps({"identity": self.identity, "address": self.address})
        temporary = self.path.with_name(self.path.name + ".new")
        try:
            if _read(self.path) == orjson.loads(data):
                return
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temporary, self.path)
        except OSError as exc:
            log.error("could not record the spool's database in %s: %s", self.path, exc)


def _read(path: Path) -> dict | None:
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, orjson.JSONDecodeError) as exc:
        # Unreadable is not "none": refusing to guess keeps the calls on disk for the operator.
        return {"identity": f"unreadable ({exc})", "address": None}
    return data if isinstance(data, dict) else {"identity": "unreadable", "address": None}


def _address(sessions: async_sessionmaker[AsyncSession]) -> str | None:
    """The database's URL without its password (the file is no place for secrets)."""
    bind = sessions.kw.get("bind")
    url = getattr(bind, "url", None)
    return url.set(password=None).render_as_string(hide_password=False) if url is not None else None
