"""`rlproxy run --agent-user`: the agents' programs run as another user, so the runner's journal, its task files
(evaluation answers included) and the other attempts' tasks are out of their reach; a task file that user could
read is refused before the run. Switching users needs root: these tests say so and are skipped elsewhere. Real
processes: the proxy in front of the stand-in engine, the runner, the agents."""
from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from testkit.processes import rlproxy_command

AGENT_USER = "nobody"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching the agents' user needs root; the runner here "
                                                          f"runs as uid {os.geteuid()}")


def others_may_run(program: Path) -> bool:
    """Whether a user other than its owner may run `program`: every folder above it searchable by others."""
    return all(folder.stat().st_mode & 0o001 for folder in program.parents) and bool(program.stat().st_mode & 0o001)


def run(proxy_url: str, folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(rlproxy_command("run", "--proxy", proxy_url, "--log", str(folder / "run.jsonl"),
                                          "--attempts", "2", *args),
                          capture_output=True, text=True, timeout=180)


@needs_root
def test_agents_run_as_their_user_and_reach_only_their_own_task(proxy_url, tmp_path):
    private = tmp_path / "runner"  # the runner's files, in a folder only it may enter
    private.mkdir(mode=0o700)
    tasks = private / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "one", "answer": "secret-answer-1"}) + "\n"
                     + json.dumps({"id": "two", "answer": "secret-answer-2"}) + "\n")
    # where the agents write what they found (the test's, not the runner's; pytest's folders are root's alone)
    out = Path(tempfile.mkdtemp(prefix="rlproxy-seen-"))
    out.chmod(0o777)
    # each attempt: who it runs as, whether it can read its own task, the task file, the journal
    agent = (f'f="{out}/$RLPROXY_ROLLOUT_ID"; id -u > "$f"; '
             f'cat "$RLPROXY_TASK_FILE" >/dev/null 2>&1 && echo own >> "$f"; '
             f'cat {tasks} >/dev/null 2>&1 && echo tasks >> "$f"; '
             f'cat {private}/run.jsonl >/dev/null 2>&1 && echo journal >> "$f"; '
             f'sleep 1; echo 1')
    # one at a time: attempts running at once as one user could read each other's (docs/run.md)
    done = run(proxy_url, private, "--tasks", str(tasks), "--task-id-field", "id", "--agent-user", AGENT_USER,
               "--concurrency", "1", "--command", agent)
    assert done.returncode == 0, done.stderr
    seen = {path.name: path.read_text().split() for path in out.iterdir()}
    shutil.rmtree(out)
    assert len(seen) == 4, seen
    for lines in seen.values():
        assert lines[0] == str(pwd.getpwnam(AGENT_USER).pw_uid)  # not the runner's root
        assert "own" in lines and "tasks" not in lines and "journal" not in lines, lines


@needs_root
def test_a_task_or_key_file_the_agents_user_can_read_is_refused(proxy_url, tmp_path):
    shared = Path(tempfile.mkdtemp(prefix="rlproxy-shared-"))  # pytest's own folders are root's alone
    shared.chmod(0o755)
    tasks = shared / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "one"}) + "\n")
    tasks.chmod(0o644)
    done = run(proxy_url, shared, "--tasks", str(tasks), "--agent-user", AGENT_USER, "--command", "echo 1")
    assert done.returncode == 2, done.stderr
    assert f"--tasks {tasks}: the agents' user {AGENT_USER} can read it" in done.stderr
    assert "chmod 600" in done.stderr and not (shared / "run.jsonl").exists()
    tasks.chmod(0o600)
    key = shared / "runner-key"  # the runner's key in a file that user could read: refused alike
    key.write_text("rlp_" + "k" * 43 + "\n")
    key.chmod(0o644)
    done = run(proxy_url, shared, "--tasks", str(tasks), "--agent-user", AGENT_USER, "--api-key-file", str(key),
               "--command", "echo 1")
    assert done.returncode == 2 and f"--api-key-file {key}: the agents' user {AGENT_USER} can read it, and with " \
        "it the runner's key" in done.stderr, done.stderr
    shutil.rmtree(shared)


def test_an_unknown_agent_user_is_refused_and_a_function_agent_runs_as_the_agent_user(proxy_url, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "one"}) + "\n")
    unknown = run(proxy_url, tmp_path, "--tasks", str(tasks), "--agent-user", "no-such-user-here",
                  "--command", "echo 1")
    assert unknown.returncode == 2 and "--agent-user 'no-such-user-here': no such user" in unknown.stderr
    if os.geteuid() == 0:
        # an --agent function runs in a process of its own (runner/function_agent.py), as that user too: where
        # this Python is not that user's to run (a pyenv under /root), its attempts say so; never run as root
        asked = tmp_path / "asked.jsonl"
        asked.write_text(json.dumps({"id": "two", "question": "What is 3+4?", "answer": "7"}) + "\n")
        function = run(proxy_url, tmp_path, "--tasks", str(asked), "--agent-user", AGENT_USER,
                       "--agent", "examples.run_agent:solve")
        assert function.returncode == 0, function.stderr
        statuses = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
        ends = [line for line in statuses if line["event"] == "finished"]
        if others_may_run(Path(sys.executable).resolve()):
            assert all(line["status"] != "failed" for line in ends), ends
        else:
            assert ends and all("Permission denied" in line["error"] for line in ends), ends
