"""`rlproxy run --harness qwen-code`: the real Qwen Code (npm, in .venv/node beside Claude Code and Codex) per
attempt against the scripted stand-in (tests/harness_engine.py) behind the proxy: it calls its shell tool to
write the marker file, then answers; rewarded by --verify and recorded exactly (tests/harness_checks.py)."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.harness_checks import handed_back, recorded_calls, run_attempt
from tests.harness_engine import MARKER, SHELL_COMMAND

BIN = Path(sys.prefix) / "node" / "node_modules" / ".bin"  # scripts/install.sh installs it there

pytestmark = pytest.mark.skipif(not shutil.which("node"),
                                reason="node is not installed (Qwen Code is a Node program)")


def test_qwen_code_runs_its_shell_tool_and_answers(harness_stand_in, tmp_path, monkeypatch):
    if not (BIN / "qwen").exists():
        pytest.fail(f"{BIN / 'qwen'} is missing: run `make install`", pytrace=False)
    proxy, log = harness_stand_in
    prompt = "--yolo=false -p 'hi': write the marker file."  # text on its standard input, never options
    verify = f'test "$(cat {MARKER})" = rlproxy-ok'
    entry = run_attempt(proxy, tmp_path, monkeypatch, "qwen-code", prompt, verify)
    assert entry["status"] == "rewarded" and entry["reward"] == 1.0, entry.get("error")
    calls = recorded_calls(proxy, entry, log)
    tool_calls = [c for c in calls if isinstance(c["sent"]["answer"], dict)]
    assert [json.loads(c["sent"]["answer"]["arguments"])["command"] for c in tool_calls] == [SHELL_COMMAND]
    assert {c["route"] for c in calls} == {"chat"}
    handed_back([c for c in calls if c["request"].get("tools")])
    assert any(prompt in json.dumps(c["request"]["messages"]) for c in calls)
