"""`rlproxy run` confines its agents (runner/confine.py, Landlock): an agent run as the runner's own user, root
here, cannot read the journal, the task files (evaluation answers), the key file, another attempt's task or the
runner's environment, through links or inherited descriptors either, nor signal the runner; it still runs, its
calls are recorded, and what it left running is ended. `rlproxy run` is a real process, as a user runs it, in
front of the shared proxy and stand-in engine; the agent is tests/scripts/reach.py. Skipped where the kernel has
no Landlock."""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import sys
import time
from pathlib import Path

import pytest
import requests

from runner.confine_landlock import abi
from testkit.processes import rlproxy_command
from tests.support import PYTHON, ROOT, free_port, running, running_proxy

VERSION, WHY = abi()
pytestmark = pytest.mark.skipif(VERSION == 0, reason=f"agents cannot be confined here: {WHY}")
RUNNER_KEY = "rlp_the-runners-own-key-" + "k" * 20


def runner_files(folder: Path) -> dict[str, Path]:
    """What the runner keeps to itself, in one folder of its own, as an operator would lay it out."""
    folder.mkdir(mode=0o700)
    files = {"tasks": folder / "tasks.jsonl", "eval_tasks": folder / "eval.jsonl", "key_file": folder / "key",
             "journal": folder / "run.jsonl"}
    files["tasks"].write_text("".join(json.dumps({"id": f"t{n}", "answer": f"train-answer-{n}", "prompt": "Go."}) + "\n"
                                      for n in range(2)))
    files["eval_tasks"].write_text(json.dumps({"id": "e0", "answer": "eval-answer-0", "prompt": "Go."}) + "\n")
    files["key_file"].write_text(RUNNER_KEY + "\n")
    return files


def run(proxy_url: str, tmp_path: Path, *agent: str, concurrency: int = 3,
        path: str = os.environ["PATH"]) -> tuple[subprocess.CompletedProcess, dict[str, Path], Path]:
    files = runner_files(tmp_path / "runner")
    shared, out = tmp_path / "shared", tmp_path / "out"
    shared.mkdir()
    out.mkdir()
    targets = {name: str(path) for name, path in files.items()}
    env = {"PATH": path, "HOME": os.environ.get("HOME", "/root"), "RLPROXY_API_KEY_FILE":
           str(files["key_file"]), "REACH_TARGETS": json.dumps(targets), "REACH_SHARED": str(shared),
           "REACH_OUT": str(out), "RLPROXY_CONFINE_AGENTS": "1", "PYTHONPATH": str(ROOT)}
    runner = subprocess.Popen(
        rlproxy_command("run", "--proxy", proxy_url, "--log", str(files["journal"]), "--tasks", str(files["tasks"]),
                        "--eval-tasks", str(files["eval_tasks"]), "--task-id-field", "id", "--attempts", "1",
                        "--concurrency", str(concurrency), "--timeout", "60", "--require-confinement",
                        "--pass-env", "REACH_TARGETS", "--pass-env", "REACH_SHARED", "--pass-env", "REACH_OUT",
                        "--agent-write", str(shared), "--agent-write", str(out), *agent),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    (shared / "runner.pid").write_text(str(runner.pid))  # for the agents to try the runner's /proc files
    stdout, stderr = runner.communicate(timeout=120)
    return subprocess.CompletedProcess(runner.args, runner.returncode, stdout, stderr), files, out


def journal(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_kept_out(found: dict, files: dict[str, Path]) -> None:
    assert {name: said.split(":")[0] for name, said in found["files"].items()} == {
        "tasks": "refused", "eval_tasks": "refused", "key_file": "refused", "journal": "refused"}, found["files"]
    assert found["own_task"].startswith("read: "), found["own_task"]  # its own task, and only that
    assert found["other_tasks"] is not None and all(said.startswith("refused") for said in found["other_tasks"].values()), \
        found["other_tasks"]
    # its parent's and the runner's: refused (the runner's is blank besides), never the runner's key
    assert RUNNER_KEY not in json.dumps(found["environ"]), found["environ"]
    assert found["environ"][str(found["runner"])] in ("read: ", "refused: Permission denied")
    # made in its HOME (a verifier's is the runner's, where it cannot even make one), read: never the journal
    assert found["links"]["symlink"] == "refused: Permission denied", found["links"]
    assert found["links"]["hardlink"] in ("refused: Invalid cross-device link", "refused: Permission denied")
    assert found["forge"].startswith("refused") and found["unlink"].startswith("refused"), found
    assert all(said.startswith("refused") for said in found["runner_proc"].values()), found["runner_proc"]
    assert not found["fds"], found["fds"]  # no descriptor of the runner's beyond its standard input and output
    if VERSION >= 6:  # signals scoped to the agent's own domain
        assert found["signal"].startswith("refused"), found["signal"]


def ended(pid: int) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def test_command_agents_reach_their_own_task_alone_and_are_recorded(proxy_url, tmp_path):
    done, files, out = run(proxy_url, tmp_path, "--command", f"{PYTHON} tests/scripts/reach.py")
    assert done.returncode == 0, done.stderr
    lines = journal(files["journal"])
    assert all(line["confined"] is True and line["landlock_abi"] == VERSION
               for line in lines if line["event"] == "started")
    ends = [line for line in lines if line["event"] == "finished"]
    assert sorted(line["task_id"] for line in ends) == ["e0", "t0", "t1"]
    assert all(line["status"] == "rewarded" and line["calls"] == 1 for line in ends), ends
    for line in ends:
        found = json.loads((out / f"{line['rollout_id']}.json").read_text())
        assert_kept_out(found, files)
        assert ended(found["sleeper"]), "a process the agent left running outlived the run"
        stored = requests.get(f"{proxy_url}/rollouts/{line['rollout_id']}", timeout=10).json()
        assert len(stored["calls"]) == 1 and stored["calls"][0]["status"] == "ok"


def test_an_agent_class_is_kept_out_alike(proxy_url, tmp_path):
    done, files, out = run(proxy_url, tmp_path, "--agent-class", "tests.scripts.reach:Reach")
    assert done.returncode == 0, done.stderr
    ends = [line for line in journal(files["journal"]) if line["event"] == "finished"]
    assert len(ends) == 3 and all(line["calls"] == 1 and line["error"] is None for line in ends), ends
    for line in ends:
        assert_kept_out(json.loads((out / f"{line['rollout_id']}.json").read_text()), files)


def test_an_agent_function_runs_in_a_process_of_its_own_and_is_kept_out_alike(proxy_url, tmp_path):
    """Run in the runner, a function could read the runner's key in its memory; named on the command line it runs
    in a process of its own (runner/function_agent.py), confined as programs are."""
    done, files, out = run(proxy_url, tmp_path, "--agent", "tests.scripts.reach:reach")
    assert done.returncode == 0, done.stderr
    lines = journal(files["journal"])
    assert all(line["confined"] is True for line in lines if line["event"] == "started")
    ends = [line for line in lines if line["event"] == "finished"]
    assert len(ends) == 3 and all(line["status"] == "rewarded" and line["calls"] == 1 for line in ends), ends
    for line in ends:
        found = json.loads((out / f"{line['rollout_id']}.json").read_text())
        assert_kept_out(found, files)


@pytest.fixture(scope="module")
def probing_harness(database_url, run_dir):
    """The scripted stand-in (tests/harness_engine.py) whose tool call runs the probe in the harness's shell."""
    port = free_port()
    args = [PYTHON, str(ROOT / "tests" / "harness_engine.py"), "--port", str(port), "--log",
            str(run_dir / "confined-harness-requests.jsonl"), "--shell-command",
            f"{PYTHON} {ROOT}/tests/scripts/reach.py harness > rlproxy-marker.txt"]
    with running(args, f"http://127.0.0.1:{port}/health", log_path=run_dir / "confined-harness-engine.log"):
        with running_proxy([f"http://127.0.0.1:{port}"], database_url, run_dir, "confined-harness-proxy") as url:
            yield url


@pytest.mark.skipif(not (Path(sys.prefix) / "node" / "node_modules" / ".bin" / "claude").exists(),
                    reason="Claude Code is not installed (make install)")
def test_a_harness_shell_tool_and_its_verifier_are_kept_out_alike(probing_harness, tmp_path):
    bin_folder = Path(sys.prefix) / "node" / "node_modules" / ".bin"
    done, files, out = run(probing_harness, tmp_path, "--harness", "claude-code", "--verify",
                           f"test \"$(cat rlproxy-marker.txt)\" = rlproxy-ok && {PYTHON} {ROOT}/tests/scripts/reach.py",
                           path=f"{bin_folder}{os.pathsep}{os.environ['PATH']}")
    assert done.returncode == 0, done.stderr
    ends = [line for line in journal(files["journal"]) if line["event"] == "finished"]
    assert len(ends) == 3 and all(line["status"] == "rewarded" and line["reward"] == 1.0 for line in ends), ends
    reports = [json.loads(path.read_text()) for path in out.iterdir()]
    assert len(reports) == 6  # the harness's shell tool and the verifier, in each attempt
    for found in reports:
        assert_kept_out(found, files)


def test_a_run_started_from_home_keeps_its_hidden_files_and_env_files_out(tmp_path, monkeypatch):
    """The run started from its user's HOME (the working folder is granted): ~/.ssh, ~/.aws and a project's .env
    are refused, the rest of the folder read. A real confined program, without a proxy (runner/agents.py)."""
    import asyncio

    from runner import confine
    from runner.agents import run_process

    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY")
    (home / ".aws").mkdir()
    (home / ".aws" / "credentials").write_text("aws_secret_access_key = x")
    (home / ".env").write_text("DATABASE_URL=postgresql://u:hunter2@db/x")
    (home / "notes.txt").write_text("plain")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(home)
    assert confine.start([])[0]
    try:
        own = tempfile.mkdtemp(prefix="rlproxy-task-")
        env = {"PATH": os.environ["PATH"], **confine.fresh_home(Path(own))}
        code, out, _ = asyncio.run(run_process(
            "for f in .ssh/id_ed25519 .aws/credentials .env notes.txt; do cat $f 2>/dev/null || echo refused; done",
            env, cwd=str(home)))
    finally:
        confine.stop()
    assert code == 0 and out.decode().split("\n")[:4] == ["refused", "refused", "refused", "plain"], out
