"""One owner per spool, also while its owner stops: a proxy that opened the lock file just before the owner's clean
stop deleted it must not end up holding that old file's lock while a third proxy holds the new file's. The steps
are driven in order (a second process paused between opening the lock file and locking it), not raced."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from proxy.recording.spool import Spool, SpoolInUse

# A proxy starting on the spool, paused once between opening the lock file and locking it (the instant another
# process can delete the file); it says whether it became the spool's owner.
STARTING_PROXY = textwrap.dedent("""
    import fcntl, sys
    from pathlib import Path
    from proxy.recording.spool import Spool, SpoolInUse

    lockf, paused = fcntl.lockf, []

    def lock_after_a_pause(fd, *args):
        if not paused:
            paused.append(fd)
            print("opened", flush=True)
            sys.stdin.readline()
        return lockf(fd, *args)

    fcntl.lockf = lock_after_a_pause
    try:
        spool = Spool(Path(sys.argv[1]))
    except SpoolInUse:
        print("refused", flush=True)
    else:
        print("owner", flush=True)
        sys.stdin.readline()  # holds the spool until told to stop
""")


def start_proxy(path: Path) -> subprocess.Popen:
    proxy = subprocess.Popen([sys.executable, "-c", STARTING_PROXY, str(path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert proxy.stdout.readline().strip() == "opened"  # it has the lock file open, not locked yet
    return proxy


def go_on(proxy: subprocess.Popen) -> str:
    proxy.stdin.write("\n")
    proxy.stdin.flush()
    return proxy.stdout.readline().strip()


async def test_a_proxy_that_opened_the_lock_file_as_the_owner_stopped_does_not_share_the_spool(tmp_path):
    path = tmp_path / "spool.jsonl"
    first = Spool(path)
    starting = start_proxy(path)  # opened `spool.jsonl.lock` while `first` holds it
    try:
        await first.close()  # a clean stop: the lock file is deleted and let go
        third = Spool(path)  # another proxy starts now: it creates the lock file anew and holds it
        # The paused proxy now gets the lock of the deleted file: it must see that this file is gone from the path
        # and try the one there, which `third` holds.
        assert go_on(starting) == "refused"
    finally:
        starting.kill()
        starting.wait()
    await third.close()


async def test_a_proxy_that_opened_the_lock_file_as_the_owner_stopped_takes_the_spool_when_nobody_else_does(
        tmp_path):
    path = tmp_path / "spool.jsonl"
    first = Spool(path)
    starting = start_proxy(path)
    try:
        await first.close()
        assert go_on(starting) == "owner"  # it started over on a new lock file
        assert (tmp_path / "spool.jsonl.lock").exists()  # the one it holds, at the path where others look
        with pytest.raises(SpoolInUse, match="give each proxy its own --spool-path"):
            Spool(path)
    finally:
        starting.kill()
        starting.wait()
