"""What an agent does to `rlproxy run`, as a careless or hostile agent would do it: exit the runner's own process,
print its reward in colour or in a form only Python's float() reads, leave a link where the runner writes the
task, hold an administrator's key. Against the real proxy in front of the stand-in engine (Postgres); the
agents are real functions and processes."""
from __future__ import annotations

import io
import json
import math
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner
from rich.console import Console

from core.settings import RunSettings
from rlproxy.cli import main
from runner.agents import CommandAgent
from runner.run import Runner
from tests.run_support import finished, rlproxy_run, write_tasks


def exits(task: dict, config) -> float:
    """An agent whose code ends its process, as a script's `sys.exit()` or its argparse refusing argv does."""
    if task["id"] == "exits":
        sys.exit(3)
    return 1.0


async def exits_async(task: dict, config) -> float:
    if task["id"] == "exits":
        raise SystemExit("done")
    return 1.0


def test_an_agent_that_exits_ends_its_attempt_not_the_run(proxy_url, tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl", {"id": "exits"}, {"id": "fine"})
    for agent, error in (("exits", "SystemExit: 3"), ("exits_async", "SystemExit: done")):
        log = tmp_path / f"{agent}.jsonl"
        result = rlproxy_run(proxy_url, log, "--tasks", str(tasks), "--task-id-field", "id", "--attempts", "1",
                             "--agent", f"tests.test_runner_agents:{agent}")
        assert result.exit_code == 0, result.output
        assert {e["task_id"]: (e["status"], e["error"]) for e in finished(log)} == {
            "exits": ("failed", error), "fine": ("rewarded", None)}


def test_a_reward_line_is_a_decimal_number_colours_and_all(proxy_url, tmp_path):
    """The last line in colour is the number it shows; "1_0" and an Arabic-Indic one are not decimal numbers
    (Python's float() reads them as 10 and 1): the attempt is unrewarded, not scored ten."""
    lines = {"coloured": r"\033[32m0.5\033[0m", "underscored": "1_0", "arabic": "\u0661", "plain": "0.25"}
    tasks = write_tasks(tmp_path / "tasks.jsonl", *({"id": name, "line": line} for name, line in lines.items()))
    log = tmp_path / "run.jsonl"
    result = rlproxy_run(proxy_url, log, "--tasks", str(tasks), "--task-id-field", "id", "--attempts", "1",
                         "--env-map", "LINE=line", "--command", 'printf "$LINE\\n"')
    assert result.exit_code == 0, result.output
    assert {e["task_id"]: (e["status"], e["reward"]) for e in finished(log)} == {
        "coloured": ("rewarded", 0.5), "underscored": ("unrewarded", None), "arabic": ("unrewarded", None),
        "plain": ("rewarded", 0.25)}


def test_a_task_id_cannot_write_to_the_terminal_through_the_progress_lines(proxy_url, tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl", {"id": "clear\u001b[2Jscreen"}, {"id": "two\rlines"})
    result = CliRunner().invoke(main, ["run", "--proxy", proxy_url, "--log", str(tmp_path / "run.jsonl"),
                                       "--tasks", str(tasks), "--task-id-field", "id", "--attempts", "1",
                                       "--command", "echo 1"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "clear\\x1b[2Jscreen#0.0 failed" in result.output and "two\\x0dlines#0.0 failed" in result.output
    assert "\x1b" not in result.output and "\r" not in result.output


def raises(task: dict, config) -> float:
    """An agent whose error message holds what its output held: a screen clear, a window title, a carriage return."""
    raise RuntimeError("the model answered \x1b[2J\x1b]0;owned\x07nothing\rforged")


def says_seven(task: dict, config) -> str:
    return "seven"


def raises_at_length(task: dict, config) -> float:
    raise ValueError("x" * 10_000)


def test_a_failed_attempt_says_why_on_its_progress_line(proxy_url, tmp_path):
    """`a#0.0 failed` alone sends the user to the log: the line says why (a program's last line of standard error,
    a function's exception, a return that is no number), in one line of bounded length, with the escapes the
    agent's output held written out, never obeyed by the terminal."""
    tasks = write_tasks(tmp_path / "tasks.jsonl", {"id": "a"})
    run = ["--tasks", str(tasks), "--task-id-field", "id", "--attempts", "1"]
    missing = ("printf 'Traceback (most recent call last):\\n\\033[31mModuleNotFoundError\\033[0m: "
               "No module named openai\\n' >&2; exit 1")
    result = rlproxy_run(proxy_url, tmp_path / "command.jsonl", *run, "--command", missing)
    assert result.exit_code == 0, result.output
    assert ("a#0.0 failed: exit status 1: \\x1b[31mModuleNotFoundError\\x1b[0m: No module named openai | "
            in result.output), result.output

    result = rlproxy_run(proxy_url, tmp_path / "raises.jsonl", *run, "--agent", "tests.test_runner_agents:raises")
    assert ("a#0.0 failed: RuntimeError: the model answered \\x1b[2J\\x1b]0;owned\\x07nothing\\x0dforged |"
            in result.output), result.output
    assert "\x1b" not in result.output and "\x07" not in result.output and "\r" not in result.output

    result = rlproxy_run(proxy_url, tmp_path / "seven.jsonl", *run, "--agent", "tests.test_runner_agents:says_seven")
    assert "a#0.0 failed: ValueError: tests.test_runner_agents:says_seven returned 'seven': a reward must be a " \
           "number, not str |" in result.output, result.output

    result = rlproxy_run(proxy_url, tmp_path / "long.jsonl", *run, "--agent",
                         "tests.test_runner_agents:raises_at_length")
    [line] = [line for line in result.output.splitlines() if "a#0.0 failed" in line]
    assert "failed: ValueError: xxx" in line and "x…" in line and len(line) < 300  # the log has all of it
    assert len(finished(tmp_path / "long.jsonl")[0]["error"]) > 10_000


async def test_in_a_terminal_a_failed_attempt_is_said_above_the_progress_bar(proxy_url):
    screen = io.StringIO()
    terminal = Console(file=screen, force_terminal=True, width=300)
    settings = RunSettings(proxy=proxy_url, attempts=1, task_id_field="id")
    async with Runner(raises, settings, progress=True, console=terminal) as runner:
        await runner.run([{"id": "a"}])
    shown = screen.getvalue()
    assert "a#0.0 failed: RuntimeError: the model answered \\x1b[2J\\x1b]0;owned\\x07nothing\\x0dforged" in shown, shown
    assert "\x1b[2J" not in shown and "\x1b]0;" not in shown and "\x07" not in shown


async def test_a_task_with_a_number_json_cannot_write_fails_its_attempt(proxy_url):
    """A Parquet row or a task dict in process may hold NaN: the agent would be handed `NaN`, which is not JSON."""
    agent = CommandAgent("echo 1")
    async with Runner(agent, RunSettings(proxy=proxy_url, attempts=1)) as runner:
        outcomes = sorted(await runner.run([{"score": math.nan}, {"score": 0.5}]), key=lambda o: o.status)
    assert [(o.status, o.error) for o in outcomes] == [
        ("failed", "the task holds a number JSON cannot write (NaN or infinity)"), ("rewarded", None)]


def test_an_agent_cannot_make_the_runner_write_through_a_link(proxy_url, tmp_path, monkeypatch):
    """A harness (code a model chose) leaves `../task.json` linking to a file of the user's: the runner writes
    the task for --verify there next, and would have written it through the link."""
    precious = tmp_path / "precious"
    precious.write_text("the user's own file\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "claude"
    fake.write_text(f"#!/bin/sh\ncat > /dev/null\nln -s {precious} ../task.json\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    # the harness found is this one, whatever is installed (runner/harnesses/installed.py prefers the pinned one)
    monkeypatch.setattr("runner.harnesses.base.find_program", lambda name, pin: str(fake))
    tasks = write_tasks(tmp_path / "tasks.jsonl", {"id": "link", "prompt": "hi"})
    log = tmp_path / "run.jsonl"
    result = rlproxy_run(proxy_url, log, "--tasks", str(tasks), "--task-id-field", "id", "--attempts", "1",
                         "--harness", "claude-code", "--verify", "echo 1")
    assert result.exit_code == 0, result.output
    [entry] = finished(log)
    assert entry["status"] == "failed" and "cannot write the task to" in entry["error"], entry
    assert precious.read_text() == "the user's own file\n" and oct(precious.stat().st_mode & 0o777) != "0o600"


def test_agents_never_get_an_administrators_key(tenants, tmp_path):
    """Not the runner's (without --agent-api-key), nor one given them with --agent-api-key."""
    tasks = write_tasks(tmp_path / "tasks.jsonl", {"id": "one"})
    base = ["--tasks", str(tasks), "--attempts", "1", "--command", "echo 1"]
    given = rlproxy_run(tenants.url, tmp_path / "a.jsonl", *base, env={
        "RLPROXY_API_KEY": tenants.keys["operator"], "RLPROXY_AGENT_API_KEY": tenants.keys["alpha-admin"]})
    assert given.exit_code == 2 and given.output.strip() == (
        "rlproxy run: the agents' key (--agent-api-key) is an administrator's: give them a project key without "
        "admin rights (rlproxy keys create --project P)")
    assert not Path(tmp_path / "a.jsonl").read_text()  # no attempt started
    own = rlproxy_run(tenants.url, tmp_path / "b.jsonl", *base, env={
        "RLPROXY_API_KEY": tenants.keys["operator"], "RLPROXY_AGENT_API_KEY": tenants.keys["alpha"]})
    assert own.exit_code == 0, own.output
    assert [e["status"] for e in finished(tmp_path / "b.jsonl")] == ["rewarded"]
    assert json.loads((tmp_path / "b.jsonl").read_text().splitlines()[0])["event"] == "started"


def test_a_process_an_agent_started_in_a_session_of_its_own_ends_with_the_run(proxy_url, tmp_path):
    """A coding agent's shell tool, or a model writing `setsid server &`, starts a process outside the attempt's
    process group, whose kill it escapes; its parent exits at once. While the run lasts it keeps running (an
    attempt may still use it); once `rlproxy run` has ended, nothing it started runs on."""
    tasks = write_tasks(tmp_path / "tasks.jsonl", {"id": "a"}, {"id": "b"})
    pids = tmp_path / "pids"
    agent = f"setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $! >> {pids}; sleep 0.5; echo 1"
    run = subprocess.run([sys.executable, "-m", "rlproxy.cli", "run", "--proxy", proxy_url, "--log",
                          str(tmp_path / "run.jsonl"), "--tasks", str(tasks), "--task-id-field", "id",
                          "--attempts", "1", "--command", agent], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    escaped = [int(line) for line in pids.read_text().split()]
    assert len(escaped) == 2
    assert "ended 2 processes the agents left running" in run.stderr
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in escaped) and time.monotonic() < deadline:
        time.sleep(0.1)  # init reaps them once the runner has exited
    assert not [pid for pid in escaped if Path(f"/proc/{pid}").exists()]
