"""What the demo tells the user while it runs, on a terminal or not.

Start-up is a sequence of steps (preparing the model, starting the engine, measuring the base model), each
shown with its elapsed time, how long it usually takes, what it waits for and, where it runs tasks, a bar
over them. Then the run: the live panel (demo/view.py).

On a terminal one rich Live region, redrawn in place, shows the current step and then the panel, from the
first step to the summary; each finished step and each warning is printed above it once. Nothing else
writes to the terminal meanwhile (demo/output.py sends everything else to log files).
Without a terminal (CI, `> file`) or with --headless: a line when a step begins or ends, one per event (a new
version), and a progress line every `every` seconds, on stderr.

    report = Report(terminal)
    async with report.shown(progress, settings):
        report.note("starting the engine", expected=(30, 90))
        report.waiting_for("the weights to load")
        with report.counting(48) as tick:   # a bar over 48 tasks; tick() as each one ends
            ...
        report.start_run()                  # start-up done: the panel
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from rich.console import Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from demo.output import Alerts, Terminal
from demo.view import LivePanel, _clock

REFRESH_SECONDS = 0.5


@dataclass
class Step:
    title: str
    started: float
    expected: tuple[float, float] | None = None  # the seconds it usually takes, (low, high)
    waiting: str = ""  # what it waits for now
    ended: float | None = None  # it never finished: stopped (Ctrl-C) or failed


class Report:
    """Start-up steps, then the run, for a `Terminal` (None: nothing is shown, the log files still get all)."""

    def __init__(self, terminal: Terminal | None = None, *, every: float = 30.0) -> None:
        self.terminal = terminal
        self.every = every
        self.began = time.monotonic()
        self.step: Step | None = None
        self.count: list[int] | None = None  # [done, total] of the tasks being run now
        self.running = False  # start-up is over: the panel shows
        self.progress = self.settings = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_line = 0.0
        self._thread = threading.get_ident()

    # --- what the demo tells it -------------------------------------------------------------------------
    def note(self, text: str, *, expected: tuple[float, float] | None = None, waiting: str = "") -> None:
        """During start-up a note begins the next step; during the run it is an event (a new version...)."""
        if not self.running:
            self._finish_step()
            self.step = Step(text, time.monotonic(), expected, waiting)
            self._line(text + (f" (usually {expected[0]:.0f}-{expected[1]:.0f} s)" if expected else ""))
        elif self.terminal is not None and not self.terminal.live:
            self._line(text)

    def waiting_for(self, text: str) -> None:
        if self.step is not None:
            self.step.waiting = text

    @contextlib.contextmanager
    def counting(self, total: int) -> Iterator[Callable[[], None]]:
        """A bar over `total` tasks for the current step (or, during the run, under the panel)."""
        self.count = [0, total]

        def tick() -> None:
            if self.count is not None:
                self.count[0] += 1

        try:
            yield tick
        finally:
            self.count = None

    def warn(self, text: str) -> None:
        """One clear line, with where the details are. Safe from any thread (log records come from several)."""
        if self.terminal is None:
            return
        if self._loop is not None and threading.get_ident() != self._thread:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the run is over, the log has it
                self._loop.call_soon_threadsafe(self.warn, text)
            return
        line = f"{text} (details: {self.terminal.rlproxy_log})"
        if self.terminal.live:
            self.terminal.console.print(Text(line, style="yellow"))
        else:
            self.terminal.err.write(line + "\n")

    def start_run(self) -> None:
        """Start-up is over: from now on the panel (or progress lines)."""
        self._finish_step()
        self.step = None
        self.running = True

    # --- showing it -------------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def shown(self, progress, settings):
        """Shows the steps and the panel (terminal) or prints lines (no terminal) until the block ends."""
        self.progress, self.settings = progress, settings
        self._loop, self._thread = asyncio.get_running_loop(), threading.get_ident()
        if self.terminal is None:
            yield self
            return
        with Alerts(self.warn).installed():
            if not self.terminal.live:
                ticker = asyncio.create_task(self._tick_lines())
                try:
                    yield self
                finally:
                    ticker.cancel()
                return
            live = Live(get_renderable=self._frame, console=self.terminal.console, auto_refresh=False,
                        redirect_stdout=False, redirect_stderr=False, transient=False)
            # refreshed from the event loop, not rich's own thread: the state it draws changes on the loop
            with live:
                refresher = asyncio.create_task(self._refresh(live))
                try:
                    yield self
                finally:
                    refresher.cancel()
                    if self.step is not None:  # start-up did not finish: the last frame says where it stopped
                        self.step.ended = time.monotonic()
                    live.refresh()

    async def _refresh(self, live: Live) -> None:
        while True:
            live.refresh()
            await asyncio.sleep(REFRESH_SECONDS)

    async def _tick_lines(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            if time.monotonic() - self._last_line >= self.every:
                self._line(self._status())

    # --- what is drawn ----------------------------------------------------------------------------------
    def _frame(self) -> RenderableType:
        if self.running:
            return LivePanel(self.progress, self.settings, activity=self._bar())
        if self.step is None:
            return Text("")
        return self._step_view(self.step)

    def _step_view(self, step: Step) -> RenderableType:
        line = Table.grid(padding=(0, 1))
        mark = Spinner("dots", style="cyan") if step.ended is None else Text("✗", style="red")
        line.add_row(mark, Text(step.title, style="bold"), self._timing(step))
        parts: list[RenderableType] = [line]
        bar = self._bar()
        if bar is not None:
            parts.append(bar)
        if step.waiting and step.ended is None:
            parts.append(Text(f"  waiting for {step.waiting}", style="dim", no_wrap=True, overflow="ellipsis"))
        return Group(*parts)

    def _timing(self, step: Step) -> Text:
        elapsed = (step.ended or time.monotonic()) - step.started
        text = Text(_clock(elapsed))
        if step.ended is not None:
            text.append("  (not finished)", style="red")
        elif step.expected is not None:
            low, high = step.expected
            if elapsed <= high:
                text.append(f"  (usually {low:.0f}-{high:.0f} s)", style="dim")
            else:
                text.append(f"  (usually {low:.0f}-{high:.0f} s: longer on a busy machine)", style="yellow")
        return text

    def _bar(self) -> RenderableType | None:
        if self.count is None:
            return None
        done, total = self.count
        row = Table.grid(padding=(0, 1))
        row.add_row(Text("  "), ProgressBar(total=max(total, 1), completed=done, width=40),
                    Text(f"{done}/{total} tasks"))
        return row

    def _status(self) -> str:
        """The progress line printed every `every` seconds without a terminal."""
        if not self.running:
            step = self.step
            if step is None:
                return "starting"
            text = f"{step.title}: {_clock(time.monotonic() - step.started)}"
            if self.count is not None:
                text += f", {self.count[0]}/{self.count[1]} tasks done"
            return text + (f", waiting for {step.waiting}" if step.waiting else "")
        p = self.progress
        running = time.monotonic() - (p.run_started or p.started)
        rate = p.episodes / (running / 60) if running > 0 else 0.0
        text = (f"{p.episodes} episodes ({rate:.1f}/min), serving v{p.active}, {p.steps} new versions, "
                f"train reward {p.recent_reward():.2f} (last 64)")
        recent = p.recent_probe_success()
        if recent is not None:
            text += f", held-out {recent[0]:.0%} of the last {recent[1]} probes"
        if self.count is not None:
            text += f"; {p.last_event}: {self.count[0]}/{self.count[1]} tasks done"
        elif p.training_since is not None:
            text += f"; training a step ({_clock(time.monotonic() - p.training_since)})"
        return text

    def _finish_step(self) -> None:
        step = self.step
        if step is None or self.terminal is None:
            return
        seconds = time.monotonic() - step.started
        if self.terminal.live:
            self.terminal.console.print(Text.assemble(("✓ ", "green"), step.title, (f"  {_clock(seconds)}", "dim")))
        elif seconds >= 1.0:  # a quick step's line is enough
            self._line(f"{step.title}: done in {_clock(seconds)}")

    def _line(self, text: str) -> None:
        """A line without a terminal, stamped with the time since the demo began."""
        if self.terminal is None or self.terminal.live:
            return
        self._last_line = time.monotonic()
        self.terminal.err.write(f"[{_clock(self._last_line - self.began)}] {text}\n")
