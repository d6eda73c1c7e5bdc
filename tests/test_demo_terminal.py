"""`rlproxy demo` as a user sees it. A short run in a real pseudo-terminal (pexpect) at 80x24 and 120x45; what
it wrote is played into a terminal emulator (pyte), whose screen and scrollback are what the user would see
and scroll back through: rlproxy's own steps, exactly one panel (redrawn in place, never copied), no line of
anybody's log, then the summary. Without a terminal it prints time-stamped progress lines instead of the panel
(tests/test_demo.py checks that on its runs, which have none)."""
from __future__ import annotations

import io
import logging
import os
import re
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pexpect
import pyte
import pytest

from demo.output import Terminal
from demo.report import Report
from demo.run import DemoSettings, Progress
from demo.startup import EnginePhase, explain, memory_warning
from demo.view import PANEL_TITLE
from engine.local import EngineError
from tests.support import free_port

# What a log line looks like, anybody's: a timestamp, a level name, vLLM's "(APIServer pid=…)", Alembic's
# logger, a traceback or a Python warning.
LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d|\b(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b|pid=\d+|alembic"
                      r"|Traceback|Warning:|warnings\.warn|it/s\]")


def short_demo(engine_url, workdir, *extra: str) -> list[str]:
    """Half a minute of training on the shared engine after measuring the base model on 2 tasks: long enough
    for the panel to be redrawn many times, short enough for CI."""
    return [sys.executable, "-m", "rlproxy.cli", "demo", "--upstream", engine_url, "--minutes", "0.5",
            "--heldout", "2", "--concurrency", "4", "--port", str(free_port()), "--workdir", str(workdir),
            "--database-url", f"sqlite+aiosqlite:///{workdir / 'rlproxy.db'}", "--probe-share", "0.5",
            "--set", "batch_rollouts=4", "--set", "group_size=4", "--set", "group_timeout_s=15", *extra]


def in_a_terminal(command: list[str], columns: int, rows: int) -> tuple[list[str], int]:
    """Runs `command` in a pseudo-terminal of that size until it exits; returns every line the terminal
    showed, scrollback first, and the exit status."""
    screen = pyte.HistoryScreen(columns, rows, history=100_000)
    stream = pyte.ByteStream(screen)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}  # the terminal's size only
    env["TERM"] = "xterm-256color"
    child = pexpect.spawn(command[0], command[1:], dimensions=(rows, columns), env=env, timeout=420)
    while True:
        try:
            stream.feed(child.read_nonblocking(65536, timeout=420))
        except pexpect.EOF:
            break
    child.close()
    text = lambda line: "".join(line[x].data for x in range(columns)).rstrip()  # noqa: E731
    lines = [text(line) for line in screen.history.top] + [line.rstrip() for line in screen.display]
    while lines and not lines[-1]:
        lines.pop()
    return lines, child.exitstatus


@pytest.mark.engine
def test_in_a_terminal_the_demo_shows_its_steps_then_one_panel_updated_in_place(engine_url, tmp_path):
    """Two terminal sizes, one demo in each, run side by side (each has its own proxy, trainer and store on
    the shared engine): a small terminal and a large one."""
    sizes = [(80, 24), (120, 45)]
    workdirs = [tmp_path / f"{columns}x{rows}" for columns, rows in sizes]
    for workdir in workdirs:
        workdir.mkdir()
    with ThreadPoolExecutor(len(sizes)) as pool:
        shown = list(pool.map(lambda size, workdir: in_a_terminal(short_demo(engine_url, workdir), *size),
                              sizes, workdirs))
    for (columns, rows), workdir, (lines, status) in zip(sizes, workdirs, shown):
        check_the_terminal_screen(lines, status, rows, workdir)


def check_the_terminal_screen(lines: list[str], status: int, rows: int, tmp_path) -> None:
    shown = "\n".join(lines)
    assert status == 0, shown[-3000:]
    assert [line for line in lines if LOG_LINE.search(line)] == []  # the engine's and libraries' logs: in files
    titles = [i for i, line in enumerate(lines) if PANEL_TITLE in line]
    assert len(titles) == 1, shown  # one panel: every redraw replaced the last one
    [top] = titles
    bottom = next(i for i in range(top, len(lines)) if lines[i].startswith("╰"))
    assert bottom - top + 1 <= rows  # it fits the terminal, or it could not be redrawn in place
    assert sum(line.startswith("╰") for line in lines) == 1
    # before it, once: where the logs are, and each start-up step done
    assert "".join(lines[:top]).count(f"logs: {tmp_path / 'rlproxy.log'}") == 1  # (a long path wraps)
    steps = [line for line in lines[:top] if line.startswith("✓ ")]
    assert any("measuring the base model on 2 held-out tasks" in step for step in steps), lines[:top]
    # after it, the summary and the curve
    after = "\n".join(lines[bottom + 1:])
    assert "held-out success by policy version" in after
    assert f"reward curve: {tmp_path / 'rlproxy-reward-curve.png'}" in after.replace("\n", "")
    # what was kept off the screen is in the log
    log = (tmp_path / "rlproxy.log").read_text()
    assert "alembic" in log and "measuring the base model" in log


def test_a_taken_port_is_one_line_said_before_anything_starts(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = subprocess.run([*short_demo("http://127.0.0.1:9", tmp_path), "--port", str(port)],  # the last wins
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"logs: {tmp_path / 'rlproxy.log'}",
        f"port {port} is in use, so the proxy cannot listen there: stop what runs there, or choose another port "
        "with --port"]


def test_the_engines_start_up_is_told_as_what_it_waits_for():
    phase = EnginePhase()
    assert phase.update([]) == "Python to import vLLM"
    seen = ["(APIServer pid=9570) INFO 11-23 19:24:20 [api_utils.py:286] non-default args: {'port': 8123}",
            "(EngineCore pid=10225) INFO 11-23 19:25:32 [core.py:133] Initializing a V1 LLM engine (v0.32.0)"]
    assert phase.update(seen) == "the engine-core process to start (it imports vLLM too)"
    assert phase.update(["Loading safetensors checkpoint shards:   0% Completed | 0/1"]) == \
        "the engine-core process to start (it imports vLLM too)"  # an unknown line: still there
    assert phase.update(["(Worker pid=10482) INFO [cpu_model_runner.py:68] Starting to load model /m..."]) == \
        "the weights to load"


def test_a_failure_is_one_line_with_its_cause_and_the_log_that_has_the_rest(tmp_path):
    rlproxy_log, engine_log = tmp_path / "rlproxy.log", tmp_path / "engine.log"
    killed = EngineError("engine exited with code 137 before it was ready", returncode=137)
    assert explain(killed, rlproxy_log, engine_log).startswith("the engine ran out of memory")
    failed = EngineError("engine exited with code 1 before it was ready", returncode=1, log_tail=[
        "Traceback (most recent call last):", "ValueError: Unable to configure handler 'vllm'"])
    line = explain(failed, rlproxy_log, engine_log)
    assert "\n" not in line and "last error: ValueError: Unable to configure handler 'vllm'" in line
    assert line.endswith(f"(the engine's output: {engine_log})")
    assert explain(RuntimeError("boom\nmore"), rlproxy_log, None) == \
        f"rlproxy demo stopped: RuntimeError: boom (details: {rlproxy_log})"
    assert "about 7 GiB" in memory_warning(2, available=3.0) and memory_warning(2, available=64.0) is None


async def test_warnings_that_matter_are_shown_once_each_with_the_log(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    terminal = Terminal(out=out, err=err, live=False, rlproxy_log=tmp_path / "rlproxy.log", engine_log=None,
                        console=None)
    report = Report(terminal)
    async with report.shown(Progress(), DemoSettings()):
        for _ in range(3):  # a warning that repeats, as every episode fails while the engine is down
            logging.getLogger("rlproxy.demo").warning("episode failed: %s", "connection refused")
        logging.getLogger("urllib3").warning("retrying")  # a library's warning: only in the log
        logging.getLogger("some.library").error("it broke")  # any error is shown
    assert err.getvalue().splitlines() == [
        f"warning: episode failed: connection refused (details: {tmp_path / 'rlproxy.log'})",
        f"error: it broke (details: {tmp_path / 'rlproxy.log'})"]
    assert out.getvalue() == ""
