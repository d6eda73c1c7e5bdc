"""`rlproxy run --harness claude-code|codex`: the real harness per attempt in a fresh working folder, against the
scripted engine stand-in (tests/harness_engine.py: it asks the harness's shell tool to write a marker file)
behind the proxy; `--verify` checks the folder and its result is the stored reward."""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner

from rlproxy.cli import main
from tests.harness_engine import MARKER
from tests.support import PYTHON, ROOT, free_port, running, running_proxy

BIN = Path(sys.prefix) / "node" / "node_modules" / ".bin"  # scripts/install.sh installs the harnesses there

pytestmark = pytest.mark.skipif(not (shutil.which("node") and shutil.which("npm")),
                                reason="node and npm are not installed (the harnesses are Node programs)")


@pytest.fixture(scope="module")
def harness_proxy(database_url, run_dir):
    port = free_port()
    args = [PYTHON, str(ROOT / "tests" / "harness_engine.py"), "--port", str(port), "--log",
            str(run_dir / "run-harness-requests.jsonl")]
    with running(args, f"http://127.0.0.1:{port}/health", log_path=run_dir / "run-harness-engine.log"):
        with running_proxy([f"http://127.0.0.1:{port}"], database_url, run_dir, "run-harness-proxy") as url:
            yield url


@pytest.mark.parametrize("harness, program, route", [("claude-code", "claude", "messages"),
                                                      ("codex", "codex", "responses")])
def test_a_harness_run_is_recorded_and_rewarded_by_its_verifier(harness_proxy, tmp_path, monkeypatch, harness,
                                                                program, route):
    if not (BIN / program).exists():
        pytest.fail(f"{BIN / program} is missing: run `make install`", pytrace=False)
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    tasks, log, start = tmp_path / "tasks.jsonl", tmp_path / "run.jsonl", tmp_path / "start"
    tasks.write_text(json.dumps({"id": "marker", "prompt": "Write the marker file."}) + "\n")
    start.mkdir()
    (start / "README").write_text("the folder each attempt starts from\n")
    verify = f'test "$(cat {MARKER})" = rlproxy-ok && test -f README'  # the tool call ran in the copied folder
    result = CliRunner().invoke(main, [
        "run", "--proxy", harness_proxy, "--log", str(log), "--tasks", str(tasks), "--task-id-field", "id",
        "--attempts", "1", "--harness", harness, "--workdir", str(start), "--verify", verify, "--timeout", "120"],
        catch_exceptions=False)
    assert result.exit_code == 0, result.output
    [entry] = [e for e in map(json.loads, log.read_text().splitlines()) if e["event"] == "finished"]
    assert entry["status"] == "rewarded" and entry["reward"] == 1.0, entry
    rollout = requests.get(f"{harness_proxy}/rollouts/{entry['rollout_id']}", timeout=10).json()
    assert rollout["reward"] == 1.0 and len(rollout["calls"]) >= 2  # the tool call and the answer after it
    assert {call["route"] for call in rollout["calls"]} == {route}
    assert all(call["status"] == "ok" and call["completion_token_ids"] for call in rollout["calls"])
    assert not (start / MARKER).exists()  # each attempt worked on a copy


def test_a_harness_that_is_not_installed_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    result = CliRunner().invoke(main, ["run", "--tasks", str(ROOT / "examples" / "run_tasks.jsonl"), "--harness",
                                       "codex", "--verify", "true", "--log", str(tmp_path / "log.jsonl")])
    assert result.exit_code == 2
    assert result.output.strip() == ("rlproxy run: --harness codex: `codex` is not installed "
                                     "(npm install -g @openai/codex)")
