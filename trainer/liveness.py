"""No rank of a multi-rank trainer waits for a dead peer for long, and a liveness probe can tell a hung one.

A collective waits for every rank; a rank that died (SIGKILL, a lost node) while nothing is in flight is noticed
by nobody: the others wait for rank 0's next command, or rank 0 polls the store, for as long as the wait's
timeout (days, since waiting for work is normal). Two things bound it:

* `PeerWatch`: a thread in every rank that bumps its own counter in the rendezvous store (torchrun's, or rank
  0's) every few seconds and reads the others'. A peer whose counter has not moved for `timeout` seconds, or a
  store that does not answer for as long, makes this rank log which one and exit at once (os._exit: its main
  thread may be blocked inside a collective). torchrun ends the other local ranks, and the chart restarts the
  pod; a restarted job resumes from the store and the newest adapter. Counters, not clocks, so machines whose
  clocks differ agree.
* `Heartbeat`: a file per rank (`heartbeat_dir/rank-N`) whose modification time is the loop's progress: rank
  0 touches it on each pass of its loop, the others on each command of rank 0's they finish, and, while they
  wait idle for the next one, their PeerWatch does (a waiting rank is healthy as long as its peers are). The
  chart's liveness probe restarts a pod whose file is older than its bound (a step or a publish that hangs
  without any collective timing out).
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

log = logging.getLogger("rlproxy.trainer")

EXIT_PEER_LOST = 75  # what a rank that gave up on its peers exits with (EX_TEMPFAIL: starting again may work)


class Heartbeat:
    """This rank's file in `folder` (None: no file); `beat()` touches it, at most once a second."""

    def __init__(self, folder: Path | None, rank: int) -> None:
        self.path = None if folder is None else Path(folder) / f"rank-{rank}"
        self.waiting = False  # set while this rank waits idle for rank 0's next command
        self._last = 0.0
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.beat(force=True)

    def beat(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.path is None or (not force and now - self._last < 1.0):
            return
        self._last = now
        try:
            self.path.touch()
        except OSError as exc:  # a full or read-only volume: the probe will say so; the trainer goes on
            log.warning("could not touch the heartbeat file %s: %s", self.path, exc)


class PeerWatch(threading.Thread):
    """Exits this process when a peer rank (or the store) has not been heard from for `timeout` seconds."""

    def __init__(self, store, rank: int, world_size: int, timeout: float, heartbeat: Heartbeat) -> None:
        super().__init__(name="rlproxy-peer-watch", daemon=True)
        self.store, self.rank, self.world_size, self.timeout = store, rank, world_size, timeout
        self.heartbeat = heartbeat
        self.interval = max(0.2, min(5.0, timeout / 5))

    def run(self) -> None:
        now = time.monotonic()
        seen = {peer: (None, now) for peer in range(self.world_size) if peer != self.rank}
        answered = now
        while True:
            try:
                self.store.add(_key(self.rank), 1)
                counters = {peer: self.store.add(_key(peer), 0) for peer in seen}
            except Exception as exc:  # noqa: BLE001 — any failure of the store counts as not hearing from it
                if time.monotonic() - answered > self.timeout:
                    self._give_up(f"the rendezvous store (rank 0's or torchrun's) has not answered for "
                                  f"{self.timeout:.0f} s ({exc})")
            else:
                answered = now = time.monotonic()
                for peer, counter in counters.items():
                    last, since = seen[peer]
                    if counter != last:
                        seen[peer] = (counter, now)
                    elif now - since > self.timeout:
                        self._give_up(f"rank {peer} has not been heard from for {now - since:.0f} s")
                if self.heartbeat.waiting:
                    self.heartbeat.beat()
            time.sleep(self.interval)

    def _give_up(self, why: str) -> None:
        log.error("ALERT: rank %d: %s (collective_timeout_s %.0f): it died or hangs; this rank exits so that the "
                  "job starts again (torchrun, the chart)", self.rank, why, self.timeout)
        for handler in logging.getLogger().handlers + log.handlers:
            handler.flush()
        sys.stderr.flush()
        os._exit(EXIT_PEER_LOST)


PEER_GONE = ("closed by peer", "reset by peer", "timed out", "Timed out", "Broken pipe")  # gloo's and NCCL's words


def peer_lost(exc: BaseException) -> bool:
    """Whether a collective failed because a peer went away or did not answer in time (not this rank's own
    error): torch's DistError, or gloo's RuntimeError that says so."""
    import torch.distributed as dist

    return isinstance(exc, getattr(dist, "DistError", ())) or (
        isinstance(exc, RuntimeError) and any(words in str(exc) for words in PEER_GONE))


def exit_for_lost_peer(rank: int, during: str, exc: BaseException) -> None:
    """Log which collective lost its peer and exit (the job starts again, torchrun or the chart)."""
    log.error("ALERT: rank %d: lost a peer rank during %s (%s); this rank exits so that the job starts again "
              "(torchrun, the chart)", rank, during, str(exc).splitlines()[0][:300] if str(exc) else type(exc))
    raise SystemExit(EXIT_PEER_LOST) from None


def watch_peers(rank: int, world_size: int, timeout: float, heartbeat: Heartbeat) -> PeerWatch:
    """Start a PeerWatch on its own client of the rendezvous store (MASTER_ADDR:MASTER_PORT, as torchrun sets)."""
    import torch.distributed as dist

    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timedelta(seconds=timeout), wait_for_workers=False)
    watch = PeerWatch(dist.PrefixStore("rlproxy-alive", store), rank, world_size, timeout, heartbeat)
    watch.start()
    return watch


def _key(rank: int) -> str:
    return f"rank-{rank}"
