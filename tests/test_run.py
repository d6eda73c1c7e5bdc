"""`rlproxy run` against the real proxy process in front of the stand-in engine (Postgres): each way of naming
the agent, the Agent Lightning event URL and model "auto", retries of infrastructure failures only, resuming,
and bad input refused before anything starts."""
from __future__ import annotations

import importlib.util
import io
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner
from rich.console import Console

from rlproxy.cli import main
from runner.attempt import Outcome
from runner.progress import summary
from tests.run_support import TASKS, finished, rlproxy_run, stored
from tests.support import PYTHON, ROOT



@pytest.fixture
def three_tasks(tmp_path) -> Path:
    """The first three tasks: for the agents that start a process per attempt."""
    path = tmp_path / "three.jsonl"
    path.write_text("".join(TASKS.read_text().splitlines(keepends=True)[:3]))
    return path


def test_function_agent_each_attempt_is_a_recorded_rewarded_rollout(proxy_url, tmp_path):
    log = tmp_path / "run.jsonl"
    result = rlproxy_run(proxy_url, log, "--tasks", str(TASKS), "--agent", "examples.run_agent:solve",
                         "--attempts", "2", "--task-id-field", "id", "--eval-share", "0.5", "--concurrency", "4")
    assert result.exit_code == 0, result.output
    entries = finished(log)
    evaluation = {e["task_id"] for e in entries if e["split"] == "eval"}
    training = {e["task_id"] for e in entries if e["split"] == "train"}
    assert evaluation and training and not evaluation & training  # held out by task id, both splits present
    assert len(entries) == 2 * len(training) + len(evaluation)  # groups of 2 to train on, one measurement each
    for entry in entries:
        rollout = stored(proxy_url, entry["rollout_id"])
        assert entry["status"] == "rewarded" and rollout["reward"] == entry["reward"] in (0.0, 1.0)
        assert rollout["task_id"] == entry["task_id"] and rollout["eval"] == (entry["split"] == "eval")
        assert [call["model"] for call in rollout["calls"]] == ["auto"]  # asked for the rollout's policy
        assert rollout["calls"][0]["completion_token_ids"]
    assert "success is a reward >= 1" in result.output and "eval" in result.output and "v0" in result.output
    assert "/ui/#/rollouts" in result.output  # the link to the web view (docs/ui.md)


def test_async_function_agent(proxy_url, tmp_path):
    log = tmp_path / "run.jsonl"
    result = rlproxy_run(proxy_url, log, "--tasks", str(TASKS), "--agent", "examples.run_agent:solve_async",
                         "--attempts", "1")
    assert result.exit_code == 0, result.output
    assert [e["status"] for e in finished(log)] == ["rewarded"] * 6


def test_command_agent_reward_from_its_last_line_or_its_own_post(proxy_url, tmp_path, three_tasks):
    log = tmp_path / "run.jsonl"
    result = rlproxy_run(proxy_url, log, "--tasks", str(three_tasks), "--command",
                         f"{PYTHON} examples/run_command_agent.py", "--env-map", "QUESTION=question",
                         "--env-map", "ANSWER=answer", "--attempts", "1")
    assert result.exit_code == 0, result.output
    entries = finished(log)
    assert len(entries) == 3 and all(e["status"] == "rewarded" and e["calls"] == 1 for e in entries)
    assert all(stored(proxy_url, e["rollout_id"])["reward"] == e["reward"] for e in entries)

    # a program that posts its reward and prints another number: the posted one is the reward
    posts_and_prints = (
        f"{PYTHON} -c \"import os, requests; requests.post(os.environ['RLPROXY_REWARD_URL'], "
        "json={'rollout_id': os.environ['RLPROXY_ROLLOUT_ID'], 'reward': 0.25}).raise_for_status(); "
        "print(0.75)\"")
    log2, one_task = tmp_path / "posted.jsonl", tmp_path / "one.jsonl"
    one_task.write_text(three_tasks.read_text().splitlines()[0])
    result = rlproxy_run(proxy_url, log2, "--tasks", str(one_task), "--command", posts_and_prints,
                         "--attempts", "1")
    assert result.exit_code == 0, result.output
    assert {e["reward"] for e in finished(log2)} == {0.25}


def test_the_demo_calculator_agent_runs_as_a_function_and_as_a_command(proxy_url, tmp_path):
    """examples/run_calculator.py, the multi-turn agent bench/run_learning.py trains through `rlproxy run`, named
    both ways: every attempt is one rollout holding all of its episode's calls, with the episode's reward."""
    tasks = tmp_path / "calc.jsonl"
    tasks.write_text(json.dumps({"id": "mul2x2:37*46", "prompt": "What is 37 * 46?", "answer": 1702,
                                 "tool": "calc"}) + "\n")
    for name, agent in (("function", ["--agent", "examples.run_calculator:solve"]),
                        ("command", ["--command", f"{PYTHON} -m examples.run_calculator"])):
        log = tmp_path / f"{name}.jsonl"
        result = rlproxy_run(proxy_url, log, "--tasks", str(tasks), *agent, "--attempts", "2",
                             "--task-id-field", "id")
        assert result.exit_code == 0, result.output
        entries = finished(log)
        assert [e["status"] for e in entries] == ["rewarded", "rewarded"], (name, entries)
        for entry in entries:
            rollout = stored(proxy_url, entry["rollout_id"])
            assert rollout["task_id"] == "mul2x2:37*46" and rollout["reward"] == entry["reward"] in (0.0, 1.0)
            assert 1 <= len(rollout["calls"]) <= 3 and {call["model"] for call in rollout["calls"]} == {"auto"}


def test_agent_lightning_class_runs_unmodified(proxy_url, tmp_path, three_tasks):
    """Each attempt runs the class in a process of its own; the agent posts Agent Lightning's reward event."""
    log = tmp_path / "run.jsonl"
    result = rlproxy_run(proxy_url, log, "--tasks", str(three_tasks), "--agent-class",
                         "examples.agl_calc_agent:CalcAgent", "--env-map", "QUESTION=question",
                         "--env-map", "ANSWER=answer", "--attempts", "1")
    assert result.exit_code == 0, result.output
    entries = finished(log)
    assert len(entries) == 3 and all(e["status"] == "rewarded" for e in entries), entries
    for entry in entries:
        rollout = stored(proxy_url, entry["rollout_id"])
        assert len(rollout["calls"]) == 1 and rollout["calls"][0]["model"] == "auto"
        assert rollout["calls"][0]["policy"] == 0 and rollout["calls"][0]["status"] == "ok"
        assert rollout["calls"][0]["completion_token_ids"]
        assert rollout["reward"] == entry["reward"] and rollout["rewards"][0]["kind"] == "final"
        assert [e["event_type"] for e in rollout["metadata"]["events"]] == ["message"]  # kept with the rollout
    assert "success" in result.output and "train" in result.output  # the summary table


def test_event_url_takes_agent_lightning_bodies(proxy_url):
    rollout_id = requests.post(f"{proxy_url}/rollouts", json={"task_id": "t"}, timeout=10).json()["rollout_id"]
    events = f"{proxy_url}/rollouts/{rollout_id}/events"
    bad = requests.post(events, json={"event_type": "reward", "data": {"value": "high"}}, timeout=10)
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "data.value"
    assert requests.post(events, json={"data": {}}, timeout=10).status_code == 422
    deep = "1"
    for _ in range(300):  # deeper than the proxy parses (64 levels) and the store can encode: refused, not a 500
        deep = '{"a":' + deep + "}"
    too_deep = requests.post(events, data='{"event_type": "span", "data": ' + deep + "}", timeout=10)
    assert too_deep.status_code == 422 and too_deep.json()["error"]["code"] == "json_too_deep"
    assert requests.post(events, json={"event_type": "log", "data": "any JSON"}, timeout=10).json()["stored"]
    assert requests.post(events, json={"event_type": "span", "data": {"name": "tool"}}, timeout=10).json()["stored"]
    assert requests.post(events, json={"event_type": "reward", "data": {"value": 1}}, timeout=10).json()["reward"] == 1
    assert requests.post(events, json={"event_type": "reward", "data": {"value": 1}}, timeout=10).status_code == 200
    assert requests.post(events, json={"event_type": "reward", "data": {"value": 0}}, timeout=10).status_code == 409
    missing = requests.post(f"{proxy_url}/rollouts/nope/events", json={"event_type": "reward",
                                                                        "data": {"value": 1}}, timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["message"]
    rollout = stored(proxy_url, rollout_id)
    assert rollout["reward"] == 1.0
    assert [(e["event_type"], e["data"]) for e in rollout["metadata"]["events"]] == [
        ("log", "any JSON"), ("span", {"name": "tool"})]


def test_infrastructure_failures_are_retried_the_agents_own_are_not(proxy_url, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "a", "marker_dir": str(tmp_path)}) + "\n")
    log = tmp_path / "run.jsonl"
    assert rlproxy_run(proxy_url, log, "--tasks", str(tasks), "--task-id-field", "id", "--attempts", "1",
                       "--agent", "tests.run_agents:engine_down_once").exit_code == 0
    retried, entry = finished(log)
    assert retried["status"] == "try_failed" and "503" in retried["error"]
    assert entry["status"] == "rewarded" and entry["tries"] == 2  # on a new rollout after the engine's 503
    assert entry["rollout_id"] != retried["rollout_id"]

    log = tmp_path / "own.jsonl"
    assert rlproxy_run(proxy_url, log, "--tasks", str(tasks), "--attempts", "1",
                       "--agent", "tests.run_agents:own_bug").exit_code == 0
    [entry] = finished(log)
    assert entry["status"] == "failed" and entry["tries"] == 1 and "own bug" in entry["error"]

    log = tmp_path / "down.jsonl"
    assert rlproxy_run(proxy_url, log, "--tasks", str(tasks), "--attempts", "1", "--retries", "1",
                       "--agent", "tests.run_agents:refused_by_engine").exit_code == 0
    assert [e["status"] for e in finished(log)] == ["try_failed", "try_failed", "infrastructure"]


def test_an_agent_over_its_timeout_is_stopped_with_everything_it_started(proxy_url, tmp_path, three_tasks):
    pids = tmp_path / "pids"
    log = tmp_path / "run.jsonl"
    result = rlproxy_run(proxy_url, log, "--tasks", str(three_tasks), "--attempts", "1", "--timeout", "1",
                         "--command", f"sleep 60 & echo $! >> {pids}; wait")
    assert result.exit_code == 0, result.output
    assert [e["status"] for e in finished(log)] == ["timeout"] * 3
    for pid in pids.read_text().split():  # the program's own children are gone too
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_a_stuck_sync_agent_does_not_hold_up_the_run(proxy_url, tmp_path, three_tasks):
    log, began = tmp_path / "run.jsonl", time.monotonic()
    result = rlproxy_run(proxy_url, log, "--tasks", str(three_tasks), "--attempts", "1", "--timeout", "0.5",
                         "--agent", "tests.run_agents:stuck")
    assert result.exit_code == 0 and time.monotonic() - began < 10  # the agents' threads sleep 20 s
    assert [e["status"] for e in finished(log)] == ["timeout"] * 3


def test_resume_skips_rewarded_attempts(proxy_url, tmp_path, three_tasks):
    log = tmp_path / "run.jsonl"
    args = ["--tasks", str(three_tasks), "--task-id-field", "id", "--agent", "examples.run_agent:solve"]
    assert rlproxy_run(proxy_url, log, *args, "--attempts", "1").exit_code == 0
    # a crash after the agent rewarded an attempt, before the runner logged its end: only "started" is logged
    rollout_id = requests.post(f"{proxy_url}/rollouts", json={"task_id": "mul-6-7"}, timeout=10).json()["rollout_id"]
    requests.post(f"{proxy_url}/reward", json={"rollout_id": rollout_id, "reward": 1.0}, timeout=10)
    with log.open("a") as file:
        file.write(json.dumps({"event": "started", "task_id": "mul-6-7", "epoch": 0, "attempt": 1,
                               "rollout_id": rollout_id}) + "\n")
    result = rlproxy_run(proxy_url, log, *args, "--attempts", "2", "--resume")
    assert result.exit_code == 0, result.output
    again = finished(log)[3:]
    assert sorted((e["task_id"], e["attempt"]) for e in again) == [("add-2-5", 1), ("add-3-4", 1)]


def test_an_interrupted_run_resumes_without_running_a_rewarded_attempt_twice(proxy_url, tmp_path):
    tasks, log = tmp_path / "tasks.jsonl", tmp_path / "run.jsonl"
    tasks.write_text("".join(json.dumps({"id": name}) + "\n" for name in "abc"))
    for name, seconds in (("a", 0), ("b", 0), ("c", 60)):  # how long each task's agent takes
        (tmp_path / name).write_text(str(seconds))
    args = ["run", "--proxy", proxy_url, "--log", str(log), "--tasks", str(tasks), "--task-id-field", "id",
            "--attempts", "1", "--env-map", "ID=id", "--command", f"sleep $(cat {tmp_path}/$ID); echo 1"]
    running = subprocess.Popen([PYTHON, "-m", "rlproxy.cli", *args], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (log.exists() and len(finished(log)) == 2) and time.monotonic() < deadline:
        time.sleep(0.1)
    running.send_signal(signal.SIGTERM)  # as a scheduler stops it (Ctrl-C alike)
    _, err = running.communicate(timeout=30)
    assert running.returncode == 130 and err.strip().endswith(f"`--resume` goes on from {log}")

    (tmp_path / "c").write_text("0")
    result = CliRunner().invoke(main, [*args, "--resume"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert [(e["task_id"], e["status"]) for e in finished(log)][2:] == [("c", "rewarded")]  # a and b skipped
    # the summary counts all three attempts: 3 rewarded, all successes, under the base model (v0)
    assert re.search(r"train\W+v0\W+3\W+3\W+100%", result.output), result.output


def test_resuming_a_run_says_what_it_skips_and_when_nothing_is_left(proxy_url, tmp_path, three_tasks):
    log = tmp_path / "run.jsonl"
    args = ["--tasks", str(three_tasks), "--task-id-field", "id", "--command", "echo 1"]
    assert rlproxy_run(proxy_url, log, *args, "--attempts", "1").exit_code == 0
    more = rlproxy_run(proxy_url, log, *args, "--attempts", "2", "--resume")  # a second attempt at each task
    assert more.exit_code == 0, more.output
    assert f"resuming from {log}: 3 attempts rewarded there are skipped, 3 to run" in more.output

    again = rlproxy_run(proxy_url, log, *args, "--attempts", "2", "--resume")
    assert again.exit_code == 0, again.output
    assert f"nothing left to do: every attempt has its reward in {log} (6 skipped)" in again.output
    assert re.search(r"train\W+v0\W+6\W+6\W+100%", again.output), again.output  # and the table, as ever
    assert len(finished(log)) == 6


def test_the_summary_lists_policy_versions_in_number_order():
    """A long run (or one resumed over many trainer steps) saw v0 to v10: v2 comes before v10, not after it."""
    outcomes = [Outcome("train", "rewarded", 1.0, version) for version in (10, 2, 0, 1, None)]
    table = io.StringIO()
    Console(file=table, width=120).print(summary(outcomes, 1.0))
    assert re.findall(r"│ train\s+│ (\S+)", table.getvalue()) == ["-", "v0", "v1", "v2", "v10", "all"]


@pytest.mark.parametrize("content, args, says", [
    ('{"id": 1}\nnot json\n', [], "tasks.jsonl line 2: not JSON"),
    ('{"id": 1}\n[1, 2]\n', [], "tasks.jsonl line 2: a task is a JSON object"),
    ('{"id": 1}\n{"id": 2, "q": "x"}\n', ["--env-map", "Q=q"], "line 1: no field 'q' (named by --env-map Q=q)"),
    ('{"id": 1}\n{"id": 1}\n', ["--task-id-field", "id"], "line 2: task id '1' repeats"),
    pytest.param("", [], "needs the datasets package (pip install datasets)", marks=pytest.mark.skipif(
        importlib.util.find_spec("datasets") is not None, reason="datasets is installed")),
])
def test_bad_task_files_are_refused_before_anything_starts(tmp_path, content, args, says):
    tasks = tmp_path / ("tasks.parquet" if "datasets" in says else "tasks.jsonl")
    tasks.write_text(content)
    result = rlproxy_run("http://127.0.0.1:9", tmp_path / "log.jsonl", "--tasks", str(tasks),
                         "--agent", "examples.run_agent:solve", *args)
    assert result.exit_code == 2 and says in result.output and len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize("agent, says", [
    (["--agent", "no_such_module:solve"], "cannot import no_such_module (ModuleNotFoundError"),
    (["--agent", "examples.run_agent:nothing"], "has no 'nothing'"),
    (["--agent-class", "json:JSONDecoder"], "is not a class with a run() method"),
    (["--agent-class", "examples.missing_agent:Agent"], "cannot import examples.missing_agent (ModuleNotFound"),
    (["--agent", "examples.run_agent:solve", "--command", "true"], "name the agent once"),
])
def test_agents_that_cannot_be_used_are_refused(tmp_path, agent, says):
    result = rlproxy_run("http://127.0.0.1:9", tmp_path / "log.jsonl", "--tasks", str(TASKS), *agent)
    assert result.exit_code == 2 and says in result.output and len(result.output.strip().splitlines()) == 1


def test_an_agent_named_by_its_file_is_told_to_name_its_module(tmp_path, monkeypatch):
    """`--agent bigger.py:solve`, as a file is named to python: the refusal says how to name it."""
    (tmp_path / "bigger.py").write_text("def solve(task, config):\n    return 1.0\n\n\nclass Agent:\n"
                                        "    def run(self):\n        pass\n")
    monkeypatch.chdir(tmp_path)  # where the user runs it
    monkeypatch.setattr(sys, "path", list(sys.path))  # the runner puts the working directory first
    for agent, says in (
            (["--agent", "bigger.py:solve"], "name it module:function, without .py (e.g. bigger:solve)"),
            (["--agent", "./bigger.py:solve"], "without .py (e.g. bigger:solve)"),
            (["--agent-class", "bigger.py:Agent"], "name it module:Class, without .py (e.g. bigger:Agent)")):
        result = rlproxy_run("http://127.0.0.1:9", tmp_path / "log.jsonl", "--tasks", str(TASKS), *agent)
        assert result.exit_code == 2 and says in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1


def test_every_flag_reads_its_environment_variable(tmp_path):
    result = CliRunner().invoke(main, ["run"], env={"RLPROXY_TASKS": str(TASKS), "RLPROXY_AGENT": "no_such:solve",
                                                     "RLPROXY_LOG": str(tmp_path / "log.jsonl")})
    assert result.exit_code == 2 and "--agent 'no_such:solve': cannot import no_such" in result.output


def test_the_runner_is_only_an_http_client_of_the_proxy():
    """runner/ imports nothing of the proxy, the store or the trainer: it runs wherever the proxy is reachable."""
    import ast

    for path in (ROOT / "runner").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert name.split(".")[0] not in {"proxy", "store", "trainer", "demo"}, (path.name, name)
