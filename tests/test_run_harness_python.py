"""`rlproxy run --harness mini-swe-agent|aider`: the real Python harnesses (each in its own virtualenv under
.venv/harnesses/, scripts/install.sh) per attempt against the scripted stand-in (tests/harness_engine.py) behind
the proxy: mini-swe-agent calls its bash tool to write the marker file, then to submit; Aider answers with a
whole-file listing of it. Each is rewarded by --verify and recorded exactly (tests/harness_checks.py)."""
from __future__ import annotations

import json

import pytest

from tests.harness_checks import HARNESS_VENVS, handed_back, recorded_calls, run_attempt
from tests.harness_engine import MARKER, SHELL_COMMAND, SUBMIT

VERIFY = f'test "$(cat {MARKER})" = rlproxy-ok'


def installed(venv: str, program: str) -> None:
    if not (HARNESS_VENVS / venv / "bin" / program).exists():
        pytest.fail(f"{HARNESS_VENVS / venv / 'bin' / program} is missing: run `make install`", pytrace=False)


def test_mini_swe_agent_runs_its_bash_tool_and_submits(harness_stand_in, tmp_path, monkeypatch):
    installed("mini-swe-agent", "mini")
    proxy, log = harness_stand_in
    prompt = '--task=not an option {{ "jinja": 1 }}: write the marker file.'  # text, never a flag or a template
    entry = run_attempt(proxy, tmp_path, monkeypatch, "mini-swe-agent", prompt, VERIFY)
    assert entry["status"] == "rewarded" and entry["reward"] == 1.0, entry.get("error")
    calls = recorded_calls(proxy, entry, log)
    assert [json.loads(c["sent"]["answer"]["arguments"])["command"] for c in calls] == [SHELL_COMMAND,
                                                                                        f"echo {SUBMIT}"]
    assert {c["route"] for c in calls} == {"chat"}
    handed_back(calls)
    first = calls[0]["request"]
    assert prompt in first["messages"][-1]["content"]
    assert first["model"] == "auto" and "temperature" not in first  # sampled at the engine's default: trainable


def test_aider_writes_the_file_its_listing_names(harness_stand_in, tmp_path, monkeypatch):
    installed("aider", "aider")
    proxy, log = harness_stand_in
    prompt = "--yes-always --message=hi: write the marker file."
    entry = run_attempt(proxy, tmp_path, monkeypatch, "aider", prompt, VERIFY)
    assert entry["status"] == "rewarded" and entry["reward"] == 1.0, entry.get("error")
    calls = recorded_calls(proxy, entry, log)
    assert len(calls) == 1 and calls[0]["route"] == "chat"
    request = calls[0]["request"]
    assert prompt in json.dumps(request["messages"][-1]["content"])
    assert request["model"] == "auto" and "temperature" not in request  # use_temperature: false
