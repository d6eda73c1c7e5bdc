"""`rlproxy run` hands a task's values to the agent's programs only as data, in an environment of their own:
the runner's environment (its key, its secrets) does not reach them unless named with `--pass-env`; a task
too large for the environment travels as a file; a task whose data cannot be handed over fails its own attempt,
with the reason, and the others finish. Against the real proxy in front of the stand-in engine (Postgres); the
agents are real processes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rlproxy.cli import main
from tests.support import PYTHON
from tests.run_support import finished, rlproxy_run, stored, write_tasks

RUNNER_KEY, AGENT_KEY = "rlp_the-runners-own-key", "rlp_the-agents-key"


def environment_of(dump: Path) -> dict[str, str]:
    """The variables a program saw, from `env -0` (values may hold newlines)."""
    return dict(entry.split("=", 1) for entry in dump.read_text().split("\0") if entry)


def test_the_agent_gets_an_allow_listed_environment_and_the_variables_the_user_passes(
        proxy_url, tmp_path, monkeypatch):
    monkeypatch.setenv("RUNNER_DATABASE_PASSWORD", "hunter2")  # a secret of the machine the runner runs on
    monkeypatch.setenv("RLPROXY_API_KEY", RUNNER_KEY)  # the runner's own key, read as its --api-key
    monkeypatch.setenv("AGENT_NEEDS_THIS", "passed on purpose")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    monkeypatch.setenv("RLPROXY_AGENT_API_KEY", AGENT_KEY)
    tasks = write_tasks(tmp_path / "tasks.jsonl", {"id": "env", "question": "What is 3+4?"})
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    result = CliRunner().invoke(main, [
        "run", "--proxy", proxy_url, "--log", str(tmp_path / "run.jsonl"), "--tasks", str(tasks),
        "--task-id-field", "id", "--attempts", "1", "--env-map", "QUESTION=question",
        "--pass-env", "AGENT_NEEDS_THIS",
        "--command", f"env -0 > {dumps}/command; cat \"$RLPROXY_TASK_FILE\" > {dumps}/task; echo 1"],
        catch_exceptions=False)
    assert result.exit_code == 0, result.output
    [entry] = finished(tmp_path / "run.jsonl")
    assert entry["status"] == "rewarded", entry
    seen = environment_of(dumps / "command")
    assert "RUNNER_DATABASE_PASSWORD" not in seen and "RLPROXY_API_KEY" not in seen
    # nor from /proc/<runner>/environ: the runner made itself not dumpable (its files are root's, not the user's)
    import ctypes
    assert ctypes.CDLL(None).prctl(3, 0, 0, 0, 0) == 0  # PR_GET_DUMPABLE
    assert RUNNER_KEY not in json.dumps(seen)  # under no name: the agent has a key of its own
    # nor the agents' key: the rollout's own token, good for this rollout alone
    assert AGENT_KEY not in json.dumps(seen) and seen["OPENAI_API_KEY"] == seen["ANTHROPIC_API_KEY"]
    assert seen["OPENAI_API_KEY"].startswith("rlr_")
    assert seen["AGENT_NEEDS_THIS"] == "passed on purpose" and seen["LC_ALL"] == "C.UTF-8"
    assert seen["QUESTION"] == "What is 3+4?" and seen["RLPROXY_TASK_ID"] == "env"
    assert seen["OPENAI_BASE_URL"] == f"{proxy_url}/rollouts/{entry['rollout_id']}/v1"
    assert json.loads((dumps / "task").read_text()) == json.loads(seen["RLPROXY_TASK"]) == {
        "id": "env", "question": "What is 3+4?"}
    # nothing else: the allow-list, the rollout's variables, the task, what was passed and mapped
    allowed = {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM"}
    extra = {name for name in seen if name not in allowed and not name.startswith(("LC_", "RLPROXY_", "OPENAI_",
                                                                                   "ANTHROPIC_"))}
    assert extra <= {"AGENT_NEEDS_THIS", "QUESTION", "PWD", "SHLVL", "_"}, extra  # the last three: the shell's


def test_an_agent_class_gets_the_same_allow_list(proxy_url, tmp_path, monkeypatch):
    monkeypatch.setenv("RUNNER_DATABASE_PASSWORD", "hunter2")
    monkeypatch.setenv("DUMP_TO", str(tmp_path / "class-env.json"))
    tasks = write_tasks(tmp_path / "tasks.jsonl", {"id": "class"})
    result = rlproxy_run(proxy_url, tmp_path / "run.jsonl", "--tasks", str(tasks), "--attempts", "1",
                         "--pass-env", "DUMP_TO", "--agent-class", "tests.run_agents:DumpsItsEnvironment")
    assert result.exit_code == 0, result.output
    seen = json.loads((tmp_path / "class-env.json").read_text())
    assert "RUNNER_DATABASE_PASSWORD" not in seen and seen["AGL_KEY"].startswith("rlr_")  # its rollout's token
    assert seen["AGL_OPENAI_BASE_URL"].endswith("/v1") and "/rollouts/" in seen["AGL_OPENAI_BASE_URL"]
    assert json.loads(seen["RLPROXY_TASK"]) == {"id": "class"} and seen["RLPROXY_TASK_FILE"].endswith("task.json")


def test_a_task_larger_than_the_environment_travels_as_a_file(proxy_url, tmp_path):
    """200 KiB: more than one environment variable may hold (128 KiB, "Argument list too long")."""
    tasks = write_tasks(tmp_path / "tasks.jsonl",
                        {"id": "big", "document": "x" * (200 * 1024), "size": 200 * 1024, "in_env": False},
                        {"id": "small", "document": "y", "size": 1, "in_env": True})
    # 1.0 when the file holds the whole task, and RLPROXY_TASK is there exactly when the task fits
    reads_the_file = (f"{PYTHON} -c \"import json, os; task = json.load(open(os.environ['RLPROXY_TASK_FILE'])); "
                      "print(float(len(task['document'])) == task['size'] and "
                      "('RLPROXY_TASK' in os.environ) == task['in_env'])\" | sed 's/True/1/; s/False/0/'")
    log = tmp_path / "run.jsonl"
    result = rlproxy_run(proxy_url, log, "--tasks", str(tasks), "--task-id-field", "id", "--attempts", "1",
                         "--command", reads_the_file)
    assert result.exit_code == 0, result.output
    assert {e["task_id"]: (e["status"], e["reward"]) for e in finished(log)} == {
        "big": ("rewarded", 1.0), "small": ("rewarded", 1.0)}


def test_a_task_whose_data_cannot_be_handed_over_fails_its_own_attempt_and_the_others_finish(proxy_url, tmp_path):
    tasks = write_tasks(
        tmp_path / "tasks.jsonl",
        {"id": "plain", "question": "What is 3+4?"},
        {"id": "nul", "question": "What is\u0000 3+4?"},  # no environment variable can hold a NUL
        {"id": "surrogate", "question": "What is \ud800?"},  # no encoding can write a lone surrogate
        {"id": "huge", "question": "q" * (100 * 1024)},  # over what --env-map puts in one variable (64 KiB)
        {"id": "after", "question": "What is 2+5?"})
    log = tmp_path / "run.jsonl"
    result = rlproxy_run(proxy_url, log, "--tasks", str(tasks), "--task-id-field", "id", "--attempts", "2",
                         "--env-map", "QUESTION=question", "--command", 'test -n "$QUESTION" && echo 1')
    assert result.exit_code == 0, result.output
    ends = {}
    for entry in finished(log):
        ends.setdefault(entry["task_id"], []).append(entry)
    assert {task: [e["status"] for e in entries] for task, entries in ends.items()} == {
        "plain": ["rewarded"] * 2, "after": ["rewarded"] * 2, "nul": ["failed"] * 2,
        "surrogate": ["failed"] * 2, "huge": ["failed"] * 2}
    assert ends["nul"][0]["error"] == ("task field 'question' (--env-map QUESTION=question) holds a NUL character "
                                       "at character 7: a program's text cannot carry it")
    assert "is not Unicode text (a lone surrogate at character 8)" in ends["surrogate"][0]["error"]
    assert "is 100 KiB, more than an environment variable carries (64 KiB)" in ends["huge"][0]["error"]
    assert all("rollout_id" not in e for e in ends["nul"] + ends["surrogate"])  # refused before any rollout
    for entry in ends["plain"] + ends["after"]:
        assert stored(proxy_url, entry["rollout_id"])["reward"] == 1.0


def test_a_task_id_the_proxy_would_refuse_fails_its_attempt(proxy_url, tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl", {"id": "bad\u0000id"}, {"id": "long" * 50_000},
                        {"id": "longer" * 43}, {"id": "line\nbreak"}, {"id": "good"})
    log = tmp_path / "run.jsonl"
    result = rlproxy_run(proxy_url, log, "--tasks", str(tasks), "--task-id-field", "id", "--attempts", "1",
                         "--command", "echo 1")
    assert result.exit_code == 0, result.output
    ends = {e["task_id"][:6]: (e["status"], e["error"], e["tries"]) for e in finished(log)}
    assert ends == {"bad\0id": ("failed", "the task id holds a NUL character at character 3: a program's text "
                                          "cannot carry it", 0),
                    "longlo": ("failed", "the task id is 200000 characters, more than a rollout's task id holds "
                                         "(256)", 0),
                    "longer": ("failed", "the task id is 258 characters, more than a rollout's task id holds (256)", 0),
                    "line\nb": ("failed", "the task id holds a control character ('\\n') at character 4", 0),
                    "good": ("rewarded", None, 1)}  # never tried as an infrastructure failure: the proxy's own rule


@pytest.mark.parametrize("flags, says", [
    (["--env-map", "LD_PRELOAD=question"], "LD_PRELOAD makes programs load or run code"),
    (["--env-map", "PATH=question"], "the runner sets PATH itself"),
    (["--env-map", "OPENAI_BASE_URL=question"], "the runner sets OPENAI_BASE_URL itself"),
    (["--env-map", "1ST=question"], "'1ST' is not a variable name"),
    (["--pass-env", "A=B"], "--pass-env 'A=B': not a variable name"),
    (["--pass-env", "OPENAI_API_KEY"], "--pass-env OPENAI_API_KEY: the runner sets it itself"),
])
def test_variable_names_a_task_value_could_abuse_are_refused_before_anything_starts(tmp_path, flags, says):
    tasks = write_tasks(tmp_path / "tasks.jsonl", {"question": "x"})
    result = rlproxy_run("http://127.0.0.1:9", tmp_path / "log.jsonl", "--tasks", str(tasks), "--command", "true",
                         *flags)
    assert result.exit_code == 2 and says in result.output and len(result.output.strip().splitlines()) == 1


def test_an_agent_that_cannot_be_started_fails_its_attempt_not_the_run(proxy_url, tmp_path):
    """40 variables of 60 KiB each: every one fits, together they are over what Linux starts a program with
    (about 2 MiB of arguments and environment)."""
    tasks = write_tasks(tmp_path / "tasks.jsonl", {"id": "wide", "text": "w" * (60 * 1024)},
                        {"id": "narrow", "text": "n"})
    mapped = [arg for number in range(40) for arg in ("--env-map", f"TEXT_{number}=text")]
    log = tmp_path / "run.jsonl"
    result = rlproxy_run(proxy_url, log, "--tasks", str(tasks), "--task-id-field", "id", "--attempts", "1",
                         *mapped, "--command", "echo 1")
    assert result.exit_code == 0, result.output
    ends = {e["task_id"]: (e["status"], e["error"]) for e in finished(log)}
    assert ends == {"wide": ("failed", "cannot start /bin/sh: Argument list too long"), "narrow": ("rewarded", None)}


def test_a_task_id_over_what_the_proxy_stores_fails_its_attempt_before_any_rollout(proxy_url, tmp_path):
    """300 characters, or a tab: the proxy would refuse either (core/ids.py, its one rule); the runner refuses them
    first, never tried, with the reason, and the run goes on."""
    tasks = write_tasks(tmp_path / "tasks.jsonl", {"id": "t" * 300}, {"id": "tab\there"}, {"id": "good"})
    log = tmp_path / "run.jsonl"
    result = rlproxy_run(proxy_url, log, "--tasks", str(tasks), "--task-id-field", "id", "--attempts", "1",
                         "--command", "echo 1")
    assert result.exit_code == 0, result.output
    ends = {e["task_id"][:4]: (e["status"], e["error"], e["tries"]) for e in finished(log)}
    assert ends["good"] == ("rewarded", None, 1)
    assert ends["tttt"] == ("failed", "the task id is 300 characters, more than a rollout's task id holds (256)", 0)
    assert ends["tab\t"] == ("failed", "the task id holds a control character ('\\t') at character 3", 0)


def test_a_rollout_the_proxy_refuses_fails_its_own_attempt_and_the_run_goes_on(stub_url, database_url, run_dir,
                                                                               tmp_path):
    """An operator bounds what POST /rollouts may hold (--max-rollout-body-bytes): a task whose id makes the body
    larger is refused (413). That attempt fails, with the proxy's reason, tried once (it is not the
    infrastructure's fault, so it is not retried); the other task is rewarded."""
    from tests.support import running_proxy

    tasks = write_tasks(tmp_path / "tasks.jsonl", {"id": "x" * 250}, {"id": "good"})
    log = tmp_path / "run.jsonl"
    with running_proxy([stub_url], database_url, run_dir, "proxy-small-rollouts",
                       "--max-rollout-body-bytes", "300") as url:
        result = rlproxy_run(url, log, "--tasks", str(tasks), "--task-id-field", "id", "--attempts", "1",
                             "--command", "echo 1")
    assert result.exit_code == 0, result.output
    ends = {e["task_id"][:4]: (e["status"], e["error"], e["tries"]) for e in finished(log)}
    assert ends["good"] == ("rewarded", None, 1)
    status, error, tries = ends["xxxx"]
    assert status == "failed" and tries == 1
    assert error.startswith("the proxy refused this attempt's rollout (POST /rollouts: 413)") and "300" in error


def test_an_agent_whose_reward_the_proxy_would_refuse_fails_its_attempt_and_what_it_left_running_is_stopped(
        proxy_url, tmp_path):
    """"nan", "inf" or 5e6 as the last line: the proxy would refuse the reward (422), which stopped the whole run;
    now that attempt fails with the reason. A program that leaves a child running in its group (`sleep &`) has
    it killed when it ends: nothing an attempt started outlives it, with the agent's key in its environment."""
    import psutil

    tasks = write_tasks(tmp_path / "tasks.jsonl", {"id": "nan"}, {"id": "vast"}, {"id": "good"})
    marker = f"rlproxy-leftover-{tmp_path.name}"
    log = tmp_path / "run.jsonl"
    result = rlproxy_run(proxy_url, log, "--tasks", str(tasks), "--task-id-field", "id", "--attempts", "1",
                         "--env-map", "ANSWER=id", "--command",
                         f'(exec -a {marker} sleep 300) > /dev/null 2>&1 & '
                         'case "$ANSWER" in nan) echo nan;; vast) echo 5e6;; *) echo 1;; esac')
    assert result.exit_code == 0, result.output
    ends = {e["task_id"]: (e["status"], e["error"]) for e in finished(log)}
    assert ends["good"] == ("rewarded", None)
    assert ends["nan"][0] == ends["vast"][0] == "failed"
    assert "'nan', is not a reward: a reward must be a finite number" in ends["nan"][1]
    assert "between -1e+06 and 1e+06" in ends["vast"][1]
    assert not [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]


def test_a_task_nested_past_64_levels_is_refused_before_the_run_starts(proxy_url, tmp_path):
    deep = "[" * 70 + "]" * 70
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "deep", "x": %s}\n{"id": "deeper", "x": %s}\n' % (deep, "[" * 5000 + "]" * 5000))
    result = rlproxy_run(proxy_url, tmp_path / "run.jsonl", "--tasks", str(tasks), "--task-id-field", "id",
                         "--attempts", "1", "--command", "echo 1")
    assert result.exit_code == 2 and "line 1: nests arrays and objects more than 64 levels" in result.output
