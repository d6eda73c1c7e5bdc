"""Keeping a long-running task of the proxy alive: if it fails, the failure is logged and counted, the task's
owner cleans up, and the task starts again after a pause that grows while failures repeat. Meanwhile a gauge
(and `running`, which `/readyz` reads) says it is not running."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from prometheus_client import Counter, Gauge

log = logging.getLogger("rlproxy.supervisor")

FIRST_PAUSE = 0.1  # seconds before the first restart
LONGEST_PAUSE = 5.0
HEALTHY_SECONDS = 60.0  # a run this long before failing starts the pauses from FIRST_PAUSE again


class Supervised:
    def __init__(self, name: str, run: Callable[[], Awaitable[None]], *, restarts: Counter, up: Gauge,
                 after_failure: Callable[[BaseException], Awaitable[None]] | None = None) -> None:
        """`run` returning ends the task; `after_failure` runs before each restart (it may fail too: that is
        logged, and the restart goes ahead)."""
        self.name = name
        self._run = run
        self._restarts = restarts
        self._up = up
        self._after_failure = after_failure
        self._task: asyncio.Task | None = None
        self.running = False

    def start(self) -> asyncio.Task:
        self._task = asyncio.create_task(self._supervise(), name=self.name)
        return self._task

    async def _supervise(self) -> None:
        pause = FIRST_PAUSE
        try:
            while True:
                began = time.monotonic()
                self._set_running(True)
                try:
                    await self._run()
                    return
                except Exception as exc:  # whatever it was, the task must go on
                    self._set_running(False)
                    self._restarts.inc()
                    if time.monotonic() - began > HEALTHY_SECONDS:
                        pause = FIRST_PAUSE
                    log.exception("the %s failed; starting it again in %.1f s", self.name, pause)
                    if self._after_failure is not None:
                        try:
                            await self._after_failure(exc)
                        except Exception:
                            log.exception("cleaning up after the %s failed", self.name)
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, LONGEST_PAUSE)
        finally:
            self._set_running(False)

    def _set_running(self, running: bool) -> None:
        self.running = running
        self._up.set(1 if running else 0)
