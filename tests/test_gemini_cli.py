"""`rlproxy run --harness gemini-cli`: the real Gemini CLI (scripts/install.sh: in .venv/node) per attempt against
the scripted stand-in (tests/harness_engine.py) behind the proxy, through the Gemini API's route: it calls its shell
tool to write the marker file, then answers. Rewarded by --verify, every call recorded exactly as the stand-in
answered it (tests/harness_checks.py), what the CLI received handed back in its next request, its folder removed
and none of its processes left."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from core.chat_view import chat_view
from tests.harness_checks import handed_back, recorded_calls, run_attempt
from tests.harness_engine import MARKER, SHELL_COMMAND

VERIFY = f'test "$(cat {MARKER})" = rlproxy-ok'
BIN = Path(sys.prefix) / "node" / "node_modules" / ".bin" / "gemini"


def test_gemini_cli_runs_its_shell_tool_through_the_gemini_api_and_is_recorded_exactly(harness_stand_in, tmp_path,
                                                                                      monkeypatch):
    if not BIN.exists():
        pytest.fail(f"{BIN} is missing: run `make install`", pytrace=False)
    proxy, log = harness_stand_in
    prompt = "--model=elsewhere -p --yolo: write the marker file."  # on standard input: text, never a flag

    entry = run_attempt(proxy, tmp_path, monkeypatch, "gemini-cli", prompt, VERIFY)

    assert entry["status"] == "rewarded" and entry["reward"] == 1.0, entry.get("error")
    calls = recorded_calls(proxy, entry, log)
    assert {c["route"] for c in calls} == {"gemini"} and all(c["stream"] for c in calls)
    turns = [c for c in calls if c["request"].get("tools")]
    assert json.loads(turns[0]["sent"]["answer"]["arguments"]) == {"command": SHELL_COMMAND}
    assert turns[-1]["sent"]["answer"] == "Done. The marker file is written."
    for turn in turns:  # what the CLI received, read back from its next request in chat form
        turn["request"] = chat_view("gemini", turn["request"], None)[0]
    handed_back(turns)
    assert prompt in json.dumps([m for m in turns[0]["request"]["messages"] if m["role"] == "user"])
    assert turns[0]["model"] == "stub-model"  # `auto`: the served model's name, which Gemini CLI does not reroute
