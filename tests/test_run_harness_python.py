"""`rlproxy run --harness mini-swe-agent|aider`: the real Python harnesses (each in its own virtualenv under
.venv/harnesses/, scripts/install.sh) per attempt against the scripted stand-in (tests/harness_engine.py)
behind the proxy: mini-swe-agent calls its bash tool to write the marker file, then to submit; Aider
answers with a whole-file listing of it. Each is rewarded by --verify and recorded exactly
(tests/harness_checks.py)."""
from __future__ import annotations

import json
import sys

import pytest
import yaml
from click.testing import CliRunner

from rlproxy.cli import main
from runner.harnesses.mini_swe_agent import yaml_document
from tests.harness_checks import HARNESS_VENVS, handed_back, recorded_calls, run_attempt
from tests.harness_engine import MARKER, SHELL_COMMAND, SUBMIT

VERIFY = f'test "$(cat {MARKER})" = rlproxy-ok'


def installed(venv: str, program: str) -> None:
    if not (HARNESS_VENVS / venv / "bin" / program).exists():
        pytest.fail(f"{HARNESS_VENVS / venv / 'bin' / program} is missing: run `make install`", pytrace=False)


def test_mini_swe_agent_runs_its_bash_tool_and_submits(harness_stand_in, tmp_path, monkeypatch):
    installed("mini-swe-agent", "mini")
    proxy, log = harness_stand_in
    # text, never a flag or a template
    prompt = '--task=not an option {{ "jinja": 1 }}: write the marker file.'
    entry = run_attempt(proxy, tmp_path, monkeypatch, "mini-swe-agent", prompt, VERIFY)
    assert entry["status"] == "rewarded" and entry["reward"] == 1.0, entry.get("error")
    calls = recorded_calls(proxy, entry, log)
    assert [json.loads(c["sent"]["answer"]["arguments"])["command"] for c in calls] == [SHELL_COMMAND,
                                                                                        f"echo {SUBMIT}"]
    assert {c["route"] for c in calls} == {"chat"}
    handed_back(calls)
    first = calls[0]["request"]
    assert prompt in first["messages"][-1]["content"]
    # sampled at the engine's default: trainable
    assert first["model"] == "auto" and "temperature" not in first


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


@pytest.mark.parametrize("installed_as, says", [
    (None, "`aider` is not installed (make install, or: python -m venv {prefix}/harnesses/aider && "
           "{prefix}/harnesses/aider/bin/pip install aider-chat==0.86.2)"),
    ("0.85.0", "{prefix}/harnesses/aider/bin/aider is at 0.85.0; rlproxy run is tested with aider-chat "
               "0.86.2 "
               "(make install, or: python -m venv {prefix}/harnesses/aider && "
               "{prefix}/harnesses/aider/bin/pip install aider-chat==0.86.2)"),
])
def test_a_harness_missing_or_at_another_version_is_refused_before_anything_starts(tmp_path, monkeypatch,
                                                                                   installed_as, says):
    if installed_as:  # a virtualenv holding another version: its script and its distribution's metadata
        venv = tmp_path / "harnesses" / "aider"
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "aider").write_text("#!/bin/sh\ntouch ran\n")
        site = venv / "lib" / "python3.11" / "site-packages"
        (site / f"aider_chat-{installed_as}.dist-info").mkdir(parents=True)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"prompt": "hi"}) + "\n")
    result = CliRunner().invoke(main, ["run", "--tasks", str(tasks), "--harness", "aider", "--verify", "true",
                                       "--log", str(tmp_path / "log.jsonl")])
    assert result.exit_code == 2
    assert result.output.strip() == f"rlproxy run: --harness aider: {says.format(prefix=tmp_path)}"
    assert not (tmp_path / "ran").exists() and not (tmp_path / "log.jsonl").exists()


@pytest.mark.parametrize("prompt", ["plain", 'quotes " and \\ and {{ task }}', "lines\n\tand\r\n",
                                    "\x7f\x85\x9f \u2028 \u2029", "emoji \U0001f600 and \ufeff",
                                    ": - [a] {b} # c", "\x1b[31m red"])
def test_mini_swe_agents_task_file_reads_back_as_the_prompt(prompt):
    """The task file mini-swe-agent reads (`-c`, PyYAML's safe_load) gives back the prompt, character for
    character."""
    assert yaml.safe_load(yaml_document({"run": {"task": prompt}})) == {"run": {"task": prompt}}
