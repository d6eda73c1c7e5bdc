"""Where the demo's output goes: the terminal shows only rlproxy's own view; the engine's output goes to
`engine.log` and every log record and stray write (library warnings, progress bars, tracebacks of threads)
to `rlproxy.log`, both in the work directory.

    with own_terminal(workdir, engine=True) as terminal:
        terminal.console.print("only this reaches the screen")

Logging handlers alone do not keep the screen clean: libraries write to file descriptors 1 and 2 directly
(Python warnings, tqdm bars when a checkpoint loads, C++ warnings of torch). So while the demo runs, fds 1
and 2 point at `rlproxy.log`, and the terminal is reached only through duplicates of the original fds.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from rich.console import Console, ConsoleDimensions

RLPROXY_LOG = "rlproxy.log"
ENGINE_LOG = "engine.log"
ENGINE_LOGGER = "engine.local.vllm"  # where engine.local.Engine sends each line the engine prints
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MAX_ALERTS = 8  # distinct warnings shown on the terminal; the rest are only in rlproxy.log


class TerminalConsole(Console):
    """A console on a duplicate of a terminal's fd. Rich reads the size from fds 0-2, which point at the log
    file while the demo runs (and stdin may not be the terminal): read it from the console's own fd."""

    @property
    def size(self) -> ConsoleDimensions:
        try:
            width, height = os.get_terminal_size(self.file.fileno())
        except (OSError, ValueError, AttributeError):
            return super().size
        return ConsoleDimensions(width, height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:  # Console's own setter, kept for callers that set it
        self._width, self._height = new_size


@dataclass
class Terminal:
    """The streams that still reach the user, and the log files everything else goes to."""
    out: TextIO  # the original stdout: the panel (on a terminal) and the summary
    err: TextIO  # the original stderr: progress lines and warnings without a terminal
    live: bool  # stdout and stderr are a terminal: one panel redrawn in place; else a line every ~30 s
    rlproxy_log: Path
    engine_log: Path | None  # None when the demo uses an engine it did not start
    console: Console

    def describe_logs(self) -> str:
        logs = f"logs: {self.rlproxy_log}"
        return logs + (f" (rlproxy), {self.engine_log} (the engine)" if self.engine_log else "")


def is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False


def configure_logging(rlproxy_log: Path, engine_log: Path | None, verbose: bool = False) -> None:
    """Every record to `rlproxy_log`; the engine's own lines, as it printed them, to `engine_log`."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    to_file = logging.FileHandler(rlproxy_log, encoding="utf-8")
    to_file.setFormatter(logging.Formatter(LOG_FORMAT))
    root.addHandler(to_file)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    logging.captureWarnings(True)  # warnings.warn -> the "py.warnings" logger -> the file
    engine = logging.getLogger(ENGINE_LOGGER)
    for handler in list(engine.handlers):
        engine.removeHandler(handler)
        handler.close()
    if engine_log is not None:
        raw = logging.FileHandler(engine_log, encoding="utf-8")
        raw.setFormatter(logging.Formatter("%(message)s"))
        engine.addHandler(raw)
        engine.propagate = False  # the engine's lines stay in engine.log, out of rlproxy.log
        engine.setLevel(logging.DEBUG)


@contextlib.contextmanager
def own_terminal(workdir: Path, *, engine: bool, headless: bool = False, verbose: bool = False) -> Iterator[Terminal]:
    """Logs to files in `workdir` (truncated: they belong to this run); fds 1 and 2 into `rlproxy.log` until
    the block ends. `engine`: the demo starts the engine, whose output goes to `engine.log`."""
    workdir = Path(workdir).resolve()
    rlproxy_log, engine_log = workdir / RLPROXY_LOG, (workdir / ENGINE_LOG if engine else None)
    for path in (rlproxy_log, engine_log):
        if path is not None:
            path.write_text("")
    live = not headless and is_terminal(sys.stdout) and is_terminal(sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = [os.dup(1), os.dup(2)]
    out = os.fdopen(saved[0], "w", buffering=1, encoding="utf-8", errors="replace")
    err = os.fdopen(saved[1], "w", buffering=1, encoding="utf-8", errors="replace")
    log_fd = os.open(rlproxy_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    try:
        configure_logging(rlproxy_log, engine_log, verbose)
        console = TerminalConsole(file=out, force_terminal=True) if live else Console(file=out)
        yield Terminal(out=out, err=err, live=live, rlproxy_log=rlproxy_log, engine_log=engine_log, console=console)
    finally:
        for stream in (sys.stdout, sys.stderr, out, err):
            with contextlib.suppress(Exception):
                stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        out.close()
        err.close()


class Alerts(logging.Handler):
    """Warnings that matter to the user, as one line each: WARNING and up from rlproxy's own loggers, ERROR
    and up from any. A message that repeats (every failing episode while the engine is down) is shown once."""

    def __init__(self, show: Callable[[str], None]) -> None:
        super().__init__(logging.WARNING)
        self.show = show
        self.seen: set[tuple[str, object]] = set()

    def emit(self, record: logging.LogRecord) -> None:
        ours = record.name == "rlproxy" or record.name.startswith("rlproxy.")
        if record.levelno < (logging.WARNING if ours else logging.ERROR) or record.name == ENGINE_LOGGER:
            return
        key = (record.name, record.msg)
        if key in self.seen or len(self.seen) > MAX_ALERTS:
            return
        self.seen.add(key)
        try:
            text = record.getMessage().splitlines()[0]
        except Exception:  # a record whose arguments do not format: the template says enough
            text = str(record.msg)
        if len(self.seen) > MAX_ALERTS:
            text = "more warnings than shown here"
        self.show(f"{logging.getLevelName(record.levelno).lower()}: {text}")

    @contextlib.contextmanager
    def installed(self) -> Iterator[Alerts]:
        root = logging.getLogger()
        root.addHandler(self)
        try:
            yield self
        finally:
            root.removeHandler(self)
