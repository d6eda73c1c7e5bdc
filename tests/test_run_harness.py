"""`rlproxy run --harness claude-code|codex` (runner/harnesses/): the real harness per attempt in a fresh working folder, against the
scripted engine stand-in (tests/harness_engine.py: it asks the harness's shell tool to write a marker file)
behind the proxy; `--verify` checks the folder and its result is the stored reward."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner

from rlproxy.cli import main
from tests.harness_engine import MARKER, SHELL_COMMAND
from tests.support import PYTHON, ROOT, free_port, running, running_proxy

BIN = Path(sys.prefix) / "node" / "node_modules" / ".bin"  # scripts/install.sh installs the harnesses there
ENV_DUMP = "rlproxy-env"  # the harness's tool call also writes the environment it runs in here (`env -0`)

pytestmark = pytest.mark.skipif(not (shutil.which("node") and shutil.which("npm")),
                                reason="node and npm are not installed (the harnesses are Node programs)")


@pytest.fixture(scope="module")
def harness_proxy(database_url, run_dir):
    port = free_port()
    args = [PYTHON, str(ROOT / "tests" / "harness_engine.py"), "--port", str(port), "--log",
            str(run_dir / "run-harness-requests.jsonl"), "--shell-command", f"{SHELL_COMMAND}; env -0 > {ENV_DUMP}"]
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
    assert result.output.strip() == (f"rlproxy run: --harness codex: `codex` is not installed (make install, or: "
                                     f"npm install --prefix {tmp_path / 'node'} @openai/codex@0.169.0)")


def installed(program: str, monkeypatch) -> None:
    if not (BIN / program).exists():
        pytest.fail(f"{BIN / program} is missing: run `make install`", pytrace=False)
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")


def run_one(proxy: str, tmp_path: Path, harness: str, task: dict, *flags: str) -> dict:
    """`rlproxy run` of one task with the harness; the attempt's logged end."""
    tasks, log = tmp_path / "tasks.jsonl", tmp_path / f"run-{len(list(tmp_path.glob('run-*')))}.jsonl"
    tasks.write_text(json.dumps({"id": "one", **task}) + "\n")
    result = CliRunner().invoke(main, ["run", "--proxy", proxy, "--log", str(log), "--tasks", str(tasks),
                                       "--task-id-field", "id", "--attempts", "1", "--harness", harness,
                                       "--timeout", "120", *flags], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    [entry] = [e for e in map(json.loads, log.read_text().splitlines()) if e["event"] == "finished"]
    return entry


def asked(proxy: str, entry: dict) -> str:
    """Every request of the attempt's rollout as the proxy stored it, as one JSON text."""
    rollout = requests.get(f"{proxy}/rollouts/{entry['rollout_id']}", timeout=10).json()
    return json.dumps([call["request"] for call in rollout["calls"]])


@pytest.mark.parametrize("harness, program, options", [
    # Claude Code ran this hook before any model call when the prompt was its argument
    ("claude-code", "claude", '--settings={{"hooks": {{"SessionStart": [{{"hooks": [{{"type": "command", '
                              '"command": "touch {hooked}"}}]}}], "UserPromptSubmit": [{{"hooks": [{{"type": '
                              '"command", "command": "touch {hooked}"}}]}}]}}}}'),
    ("codex", "codex", '--config=notify=["touch", "{hooked}"]'),
])
def test_a_prompt_that_looks_like_options_reaches_the_harness_as_text(harness_proxy, tmp_path, monkeypatch,
                                                                       harness, program, options):
    installed(program, monkeypatch)
    hooked = tmp_path / "hooked"
    prompt = options.format(hooked=hooked)
    entry = run_one(harness_proxy, tmp_path, harness, {"prompt": prompt}, "--verify", f"test -f {MARKER}")
    assert not hooked.exists()
    assert entry["status"] == "rewarded" and entry["reward"] == 1.0, entry  # it worked on the prompt
    assert json.dumps(prompt)[1:-1] in asked(harness_proxy, entry)  # sent to the model as the user's text


def test_a_prompt_larger_than_a_command_line_reaches_the_harness(harness_proxy, tmp_path, monkeypatch):
    """200 KiB: over the 128 KiB one argument may hold ("Argument list too long" aborted the whole run)."""
    installed("claude", monkeypatch)
    prompt = "Write the marker file. " + "Context line. " * (200 * 1024 // 14)
    entry = run_one(harness_proxy, tmp_path, "claude-code", {"prompt": prompt}, "--verify", f"test -f {MARKER}")
    assert entry["status"] == "rewarded", entry
    assert json.dumps(prompt)[1:-1] in asked(harness_proxy, entry)


def test_a_task_repository_that_looks_like_an_option_is_cloned_as_a_path(harness_proxy, tmp_path, monkeypatch):
    installed("claude", monkeypatch)
    hooked = tmp_path / "hooked"
    entry = run_one(harness_proxy, tmp_path, "claude-code", {"prompt": "hi", "repo": f"--upload-pack=touch {hooked};"},
                    "--repo-field", "repo", "--verify", "true")
    assert entry["status"] == "failed" and "rollout_id" in entry
    assert f"repository '--upload-pack=touch {hooked};' does not exist" in entry["error"]  # the path to clone
    assert not hooked.exists()

    upstream = tmp_path / "upstream"  # a task repository that is one: cloned, worked on, verified
    subprocess.run(["git", "init", "-q", str(upstream)], check=True)
    (upstream / "README").write_text("from the task's repository\n")
    subprocess.run(["git", "-C", str(upstream), "add", "README"], check=True)
    subprocess.run(["git", "-C", str(upstream), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "r"],
                   check=True)
    entry = run_one(harness_proxy, tmp_path, "claude-code", {"prompt": "hi", "repo": str(upstream)},
                    "--repo-field", "repo", "--verify", f"test -f README && test -f {MARKER}")
    assert entry["status"] == "rewarded", entry


def test_the_harness_and_its_verifier_get_an_allow_listed_environment(harness_proxy, tmp_path, monkeypatch):
    installed("claude", monkeypatch)
    monkeypatch.setenv("RUNNER_DATABASE_PASSWORD", "hunter2")  # a secret of the runner's machine
    monkeypatch.setenv("RLPROXY_API_KEY", "rlp_the-runners-own-key")
    monkeypatch.setenv("CLAUDE_CODE_USE_BEDROCK", "1")  # would point the harness away from the rollout
    monkeypatch.setenv("AGENT_NEEDS_THIS", "passed on purpose")
    monkeypatch.setenv("RLPROXY_AGENT_API_KEY", "rlp_the-agents-key")
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    entry = run_one(harness_proxy, tmp_path, "claude-code", {"prompt": "Write the marker file."},
                    "--pass-env", "AGENT_NEEDS_THIS",
                    "--verify", f"cp {ENV_DUMP} {dumps}/harness && env -0 > {dumps}/verify && test -f {MARKER}")
    assert entry["status"] == "rewarded", entry
    for program in ("harness", "verify"):
        seen = dict(item.split("=", 1) for item in (dumps / program).read_text().split("\0") if item)
        assert "RUNNER_DATABASE_PASSWORD" not in seen and "CLAUDE_CODE_USE_BEDROCK" not in seen, program
        assert "rlp_the-runners-own-key" not in json.dumps(seen), program
        assert seen["AGENT_NEEDS_THIS"] == "passed on purpose", program
    harness_env = dict(item.split("=", 1) for item in (dumps / "harness").read_text().split("\0") if item)
    # the rollout's own token, not the agents' key: it reaches this rollout alone
    assert harness_env["ANTHROPIC_API_KEY"].startswith("rlr_") and "RLPROXY_TASK" not in harness_env
    assert "rlp_the-agents-key" not in json.dumps(harness_env)
