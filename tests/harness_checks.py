"""What the real-harness tests (tests/test_run_harness_*.py) check of one `rlproxy run --harness NAME
--verify` attempt against the scripted stand-in (tests/harness_engine.py): rewarded by its verifier, every
call recorded exactly as the stand-in answered it (token ids and logprobs), the harness given what the
stand-in sent (its next request carries the previous answer back), its folder removed and none of its
processes left."""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner

from rlproxy.cli import main
from tests.harness_engine import prompt_sha

HARNESS_VENVS = Path(sys.prefix) / "harnesses"  # scripts/install.sh: one virtualenv per Python harness


def leftover_processes(folder: Path) -> list[str]:
    """Processes whose working folder is inside `folder`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            if cwd.startswith(str(folder)):
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{entry.name}: {command}")
    return found


def run_attempt(proxy: str, tmp_path: Path, monkeypatch, harness: str, prompt: str, verify: str,
                *flags: str) -> dict:
    """`rlproxy run` of one task with the harness, its attempts' folders under a temporary folder of the
    test's own (checked empty afterwards, with no process working in it); the attempt's logged end."""
    attempts = tmp_path / "attempts"
    attempts.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(attempts))
    tasks, log = tmp_path / "tasks.jsonl", tmp_path / "run.jsonl"
    tasks.write_text(json.dumps({"id": "marker", "prompt": prompt}) + "\n")
    result = CliRunner().invoke(main, ["run", "--proxy", proxy, "--log", str(log), "--tasks", str(tasks),
                                       "--task-id-field", "id", "--attempts", "1", "--harness", harness,
                                       "--verify", verify, "--timeout", "120", *flags],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    [entry] = [e for e in map(json.loads, log.read_text().splitlines()) if e["event"] == "finished"]
    assert list(attempts.iterdir()) == []  # the attempt's folder and home are gone
    deadline = time.monotonic() + 5
    while leftover_processes(attempts) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert leftover_processes(attempts) == []
    return entry


def recorded_calls(proxy: str, entry: dict, engine_log: Path) -> list[dict]:
    """The rollout's calls, each checked recorded exactly as the stand-in answered it; each with the
    stand-in's log line for it as `sent`."""
    rollout = requests.get(f"{proxy}/rollouts/{entry['rollout_id']}", timeout=10).json()
    answered = {line["prompt_sha"]: line for line in map(json.loads, engine_log.read_text().splitlines())}
    calls = rollout["calls"]
    assert calls and rollout["reward"] == entry["reward"]
    for call in calls:
        assert call["status"] == "ok", call
        sent = answered[prompt_sha(call["prompt_token_ids"])]  # the stand-in saw exactly the recorded prompt
        assert call["completion_token_ids"] == sent["completion_ids"]
        assert call["completion_logprobs"] == pytest.approx(sent["completion_logprobs"], abs=1e-6)
        call["sent"] = sent
    return calls


def handed_back(calls: list[dict]) -> None:
    """Every answer but the last came back in the next request as the assistant's turn: the harness
    received exactly what the stand-in sent (a tool call's arguments as the same JSON value: some harnesses
    write it back in their own spacing)."""
    for earlier, later in zip(calls, calls[1:]):
        assistant = [m for m in later["request"]["messages"] if m.get("role") == "assistant"]
        assert assistant, later["request"]
        turn, answer = assistant[-1], earlier["sent"]["answer"]
        if isinstance(answer, dict):
            [call] = turn["tool_calls"]
            assert call["function"]["name"] == answer["name"]
            assert json.loads(call["function"]["arguments"]) == json.loads(answer["arguments"])
        else:
            assert turn["content"] == answer
