"""What an attempt leaves running once its program has ended is ended before its verifier reads the folder
(runner/leftovers.py `end_leftovers_of`): a process that left the attempt's process group (`setsid cmd &`, as a
coding agent's shell tool or a model may write) would otherwise go on changing the folder the verifier reads, and
the reward would come from that rather than from what the agent had done when it ended. Another attempt's
processes are left alone. Real processes, run the way runner/agents.py runs an agent."""
from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from rlproxy.cli import main
from runner.agents import run_process
from runner.leftovers import end_leftovers_of, no_process_outlives_the_run
from tests.support import PYTHON, ROOT, free_port, running, running_proxy


def leaves_behind(folder: Path, token: str, name: str) -> tuple[str, dict[str, str]]:
    """A program that starts, in a session of its own, a process writing `name` in `folder` a second later."""
    script = f"setsid sh -c 'sleep 1; touch {folder / name}' </dev/null >/dev/null 2>&1 &"
    return script, {"PATH": os.environ["PATH"], "OPENAI_API_KEY": token}


def test_a_process_that_left_the_attempt_s_group_is_ended_before_its_verifier_runs(tmp_path):
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    mine.mkdir(), theirs.mkdir()

    async def attempts() -> int:
        for folder, token in ((mine, "rlr_mine"), (theirs, "rlr_theirs")):
            script, env = leaves_behind(folder, token, "late")
            code, _, _ = await run_process(script, env, cwd=str(folder), confined=False)
            assert code == 0
        return end_leftovers_of("rlr_mine", mine)  # what the harness does once its program ended

    with no_process_outlives_the_run():
        ended = asyncio.run(attempts())
        time.sleep(1.5)
        assert ended >= 1  # the shell, and its sleep if it had started it
        assert not (mine / "late").exists()  # ended before it wrote: the verifier sees what the agent left
        assert (theirs / "late").exists()  # another attempt's, still running when this one ended: left alone


def test_a_leftover_that_cleared_its_environment_is_found_by_its_folder(tmp_path):
    async def attempt() -> int:
        script = f"cd {tmp_path} && env -i setsid sh -c 'sleep 1; touch late' </dev/null >/dev/null 2>&1 &"
        code, _, _ = await run_process(script, {"PATH": os.environ["PATH"], "OPENAI_API_KEY": "rlr_gone"},
                                       cwd=str(tmp_path), confined=False)
        assert code == 0
        return end_leftovers_of("rlr_gone", tmp_path)

    with no_process_outlives_the_run():
        assert asyncio.run(attempt()) >= 1
        time.sleep(1.5)
        assert not (tmp_path / "late").exists()


def test_a_leftover_that_cleared_its_environment_and_left_the_folder_is_ended_too(tmp_path):
    """Carrying no attempt's token and outside every program the run is running, it is nobody else's."""
    async def attempt() -> int:
        script = f"cd / && env -i setsid sh -c 'sleep 1; touch {tmp_path}/late' </dev/null >/dev/null 2>&1 &"
        code, _, _ = await run_process(script, {"PATH": os.environ["PATH"], "OPENAI_API_KEY": "rlr_gone"},
                                       cwd=str(tmp_path), confined=False)
        assert code == 0
        return end_leftovers_of("rlr_gone", tmp_path)

    with no_process_outlives_the_run():
        assert asyncio.run(attempt()) >= 1
        time.sleep(1.5)
        assert not (tmp_path / "late").exists()


# ------------------------------------------------------------------ through a real harness and `rlproxy run`

LATE = "late-marker"  # written by what the harness's tool call left running, two seconds after it
LEFTOVER = f"setsid sh -c 'sleep 2; echo rlproxy-ok > {LATE}' </dev/null >/dev/null 2>&1 &"
BIN = Path(sys.prefix) / "node" / "node_modules" / ".bin"  # scripts/install.sh installs the harnesses there


@pytest.fixture(scope="module")
def leaving_stand_in(database_url, run_dir):
    """The scripted engine (tests/harness_engine.py) whose shell tool call leaves a process behind, and a proxy."""
    port = free_port()
    args = [PYTHON, str(ROOT / "tests" / "harness_engine.py"), "--port", str(port), "--shell-command", LEFTOVER]
    with running(args, f"http://127.0.0.1:{port}/health", log_path=run_dir / "verify-leftovers-engine.log"):
        with running_proxy([f"http://127.0.0.1:{port}"], database_url, run_dir, "verify-leftovers-proxy") as url:
            yield url


@pytest.mark.skipif(not (BIN / "claude").exists(), reason="Claude Code is not installed (`make install`)")
def test_a_harness_cannot_pass_its_verifier_by_what_it_left_running(leaving_stand_in, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    tasks, log = tmp_path / "tasks.jsonl", tmp_path / "run.jsonl"
    tasks.write_text(json.dumps({"id": "late", "prompt": "Write the marker file."}) + "\n")
    verify = f'sleep 4; test "$(cat {LATE} 2>/dev/null)" = rlproxy-ok && echo 1 || echo 0'
    result = CliRunner().invoke(main, [
        "run", "--proxy", leaving_stand_in, "--log", str(log), "--tasks", str(tasks), "--task-id-field", "id",
        "--attempts", "1", "--harness", "claude-code", "--verify", verify, "--timeout", "120"],
        catch_exceptions=False)
    assert result.exit_code == 0, result.output
    [entry] = [e for e in map(json.loads, log.read_text().splitlines()) if e["event"] == "finished"]
    # the file was not there when the harness ended: only what it left running would have written it
    assert entry["status"] == "rewarded" and entry["reward"] == 0.0, entry
