"""`rlproxy run` given what a careless user or a task file written elsewhere gives it: a file saved on Windows,
JSON only Python reads, a file that never ends a line, ids of every type, flags that would be ignored, a log
shared, edited or pointed at the wrong file. Each is read as meant or refused in one line before anything
starts (exit 2): never a traceback, never a run that silently does something else. Most need no proxy (the
port below answers nothing: what is refused is refused before it is asked)."""
from __future__ import annotations

import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from runner.tasks import TRAIN, read_tasks
from tests.support import PYTHON, ROOT
from tests.run_support import finished, rlproxy_run

NO_PROXY = "http://127.0.0.1:9"


def refused(result, says: str) -> None:
    assert result.exit_code == 2, result.output
    assert says in result.output and len(result.output.strip().splitlines()) == 1, result.output


def test_a_task_file_saved_on_windows_reads_as_written(tmp_path):
    """A byte order mark, CRLF line ends and blank lines: the tasks, and nothing of the file's form in them."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(b'\xef\xbb\xbf{"id": "a", "q": "x"}\r\n\r\n{"id": "b", "q": "y"}\r\n')
    read = read_tasks(tasks, TRAIN, id_field="id")
    assert [(task.id, task.data) for task in read] == [("a", {"id": "a", "q": "x"}), ("b", {"id": "b", "q": "y"})]


@pytest.mark.parametrize("line, says", [
    ('{"answer": NaN}', "line 2: not JSON every reader takes (NaN is not a JSON number)"),
    ('{"answer": -Infinity}', "line 2: not JSON every reader takes (-Infinity is not a JSON number)"),
    ('{"answer": 1e400}', "line 2: not JSON every reader takes (1e400 is too large for a double)"),
    ('{"answer": "7", "answer": "8"}', "line 2: not JSON every reader takes (the key 'answer' appears twice"),
    ('{"answer": ' + "9" * 5000 + "}", "line 2: not JSON every reader takes (Exceeds the limit (4300 digits)"),
])
def test_json_only_python_reads_is_refused_with_its_line(tmp_path, line, says):
    """Python reads each of these; what the agent is handed (RLPROXY_TASK) would be JSON its reader refuses, or
    one of two values, or (the long integer) a traceback."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"answer": "7"}\n' + line + "\n")
    refused(rlproxy_run(NO_PROXY, tmp_path / "log.jsonl", "--tasks", str(tasks), "--command", "true"), says)


def test_a_task_file_that_is_one_json_array_says_so(tmp_path):
    tasks = tmp_path / "tasks.json"
    tasks.write_text('[\n  {"q": "x"},\n  {"q": "y"}\n]\n')
    refused(rlproxy_run(NO_PROXY, tmp_path / "log.jsonl", "--tasks", str(tasks), "--command", "true"),
            "line 1: not JSON (Expecting value); a task file has one JSON object a line (not one JSON array)")


def test_a_file_that_never_ends_a_line_is_refused_not_read_until_memory_runs_out(tmp_path):
    result = rlproxy_run(NO_PROXY, tmp_path / "log.jsonl", "--tasks", "/dev/zero", "--command", "true")
    refused(result, "/dev/zero line 1: longer than 67,108,864 characters; a task file has one JSON object a line")


@pytest.mark.parametrize("value, says", [
    (True, "field 'id' (named by --task-id-field) is bool, not text or a whole number"),
    (1.5, "is float, not text or a whole number"),
    (["a"], "is list, not text or a whole number"),
    ({"a": 1}, "is dict, not text or a whole number"),
])
def test_a_task_id_field_that_is_not_text_or_a_whole_number_is_refused(tmp_path, value, says):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": value}) + "\n")
    refused(rlproxy_run(NO_PROXY, tmp_path / "log.jsonl", "--tasks", str(tasks), "--task-id-field", "id",
                        "--command", "true"), says)


def test_numeric_ids_are_ids_and_a_lone_surrogate_id_is_held_out_like_any_other(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": 17}\n{"id": "\\ud800"}\n')
    assert [task.id for task in read_tasks(tasks, TRAIN, id_field="id", eval_share=0.5)] == ["17", "\ud800"]
    # the command gets as far as the proxy (which does not answer): no traceback on the way
    result = rlproxy_run(NO_PROXY, tmp_path / "log.jsonl", "--tasks", str(tasks), "--task-id-field", "id",
                         "--eval-share", "0.5", "--command", "true")
    assert result.exit_code == 1 and "does not answer" in result.output, result.output


@pytest.mark.parametrize("flags, says", [
    (["--command", "true", "--verify", "pytest"], "--verify: only for --harness NAME, not --command"),
    (["--agent", "examples.run_agent:solve", "--workdir", ".", "--prompt-field", "q"],
     "--workdir, --prompt-field: only for --harness NAME, not --agent"),
    (["--harness", "claude-code", "--verify", "true", "--workdir", ".", "--repo-field", "repo"],
     "--workdir or --repo-field: the working folder is a copy of one or a clone of the other, not both"),
    (["--command", "true", "--env-map", "Q=question", "--env-map", "Q=answer"], "--env-map Q: named twice"),
    (["--command", "true", "--proxy", "127.0.0.1:8400"], "--proxy '127.0.0.1:8400': not an http:// or https://"),
    (["--command", "true", "--proxy", "http://ops:s3cret@127.0.0.1:8400"],
     "--proxy: holds a user name or password, which every agent would be handed"),
])
def test_flags_that_would_be_ignored_or_leak_are_usage_errors(tmp_path, flags, says):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"question": "q", "answer": "a"}\n')
    result = rlproxy_run(NO_PROXY, tmp_path / "log.jsonl", "--tasks", str(tasks), *flags)
    refused(result, says)
    assert "s3cret" not in result.output  # the refusal does not repeat the password either


@pytest.mark.parametrize("variable, says", [
    ("HTTPS_PROXY", "decides where programs send their requests"),
    ("https_proxy", "decides where programs send their requests"),
    ("SSL_CERT_FILE", "decides where programs send their requests"),
    ("OPENAI_API_BASE", "is in the namespace the runner and the model clients read"),
    ("ANTHROPIC_AUTH_TOKEN", "is in the namespace the runner and the model clients read"),
    ("RLPROXY_API_KEY", "is in the namespace the runner and the model clients read"),
    ("PYTHONWARNINGS", "makes programs load or run code"),
    ("GIT_EXTERNAL_DIFF", "makes programs load or run code"),
    ("npm_config_script_shell", "makes programs load or run code"),
    ("SHELLOPTS", "makes programs load or run code"),
])
def test_a_task_value_cannot_point_the_agent_elsewhere_or_make_it_run_code(tmp_path, variable, says):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"question": "q"}\n')
    refused(rlproxy_run(NO_PROXY, tmp_path / "log.jsonl", "--tasks", str(tasks), "--command", "true",
                        "--env-map", f"{variable}=question"), says)


def test_the_log_is_never_the_task_file(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"question": "q"}\n')
    refused(rlproxy_run(NO_PROXY, tasks, "--tasks", str(tasks), "--command", "true"),
            f"--log {tasks} is the --tasks file: the log is appended to; give another")
    assert tasks.read_text() == '{"question": "q"}\n'


def test_a_log_that_is_a_folder_is_bad_input(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"question": "q"}\n')
    refused(rlproxy_run(NO_PROXY, tmp_path, "--tasks", str(tasks), "--command", "true"), f"--log {tmp_path}: ")


def started_line(**fields) -> bytes:
    return (json.dumps({"event": "started", "task_id": "a", "epoch": 0, "attempt": 0, **fields}) + "\n").encode()


@pytest.mark.parametrize("edited, says", [
    (started_line(rollout_id="../metrics"), "line 1: not a log line of rlproxy run"),  # not another proxy path
    (started_line(rollout_id="r1", epoch=1e400), "line 1: not a log line of rlproxy run"),
    (started_line(rollout_id="r1", attempt="0"), "line 1: not a log line of rlproxy run"),
    (b'{"event": "started", "task_id": "\xff"}\n', "not a log of rlproxy run (not UTF-8 text)"),
])
def test_a_hand_edited_log_is_refused_on_resume(proxy_url, tmp_path, edited, says):
    tasks, log = tmp_path / "tasks.jsonl", tmp_path / "run.jsonl"
    tasks.write_text('{"id": "a"}\n')
    log.write_bytes(edited + started_line(rollout_id="r2"))  # the line after it: an edit, not a torn last line
    result = rlproxy_run(proxy_url, log, "--tasks", str(tasks), "--task-id-field", "id", "--attempts", "1",
                         "--command", "echo 1", "--resume")
    refused(result, says)


def test_two_runs_never_share_one_log(proxy_url, tmp_path):
    """Each would `--resume` from what the log showed when it began, and run the other's attempts again."""
    tasks, log = tmp_path / "tasks.jsonl", tmp_path / "run.jsonl"
    tasks.write_text('{"id": "slow"}\n')
    args = ["run", "--proxy", proxy_url, "--log", str(log), "--tasks", str(tasks), "--task-id-field", "id",
            "--attempts", "1", "--command", "sleep 30; echo 1"]
    first = subprocess.Popen([PYTHON, "-m", "rlproxy.cli", *args], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (log.exists() and '"started"' in log.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        second = rlproxy_run(proxy_url, log, "--tasks", str(tasks), "--task-id-field", "id", "--attempts", "1",
                             "--command", "echo 1", "--resume")
        refused(second, f"--log {log}: another run is writing this log; give each run its own --log")
    finally:
        first.terminate()  # SIGTERM: it stops as with Ctrl-C, and lets go of the log
        first.communicate(timeout=30)
    assert first.returncode == 130
    # once the first has ended, the log is free to resume from
    resumed = rlproxy_run(proxy_url, log, "--tasks", str(tasks), "--task-id-field", "id", "--attempts", "1",
                          "--command", "echo 1", "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert [(e["task_id"], e["status"]) for e in finished(log)] == [("slow", "rewarded")]


class HealthyButFailing(BaseHTTPRequestHandler):
    """A proxy that answers its health check and fails everything else with 503, as one going down does."""

    def do_GET(self) -> None:
        status = 200 if self.path in ("/healthz", "/metrics") else 503
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *_) -> None:
        pass


def test_a_proxy_that_fails_while_resuming_is_said_in_one_line(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), HealthyButFailing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    tasks, log = tmp_path / "tasks.jsonl", tmp_path / "run.jsonl"
    tasks.write_text('{"id": "a"}\n')
    log.write_bytes(started_line(rollout_id="r1"))
    try:
        result = rlproxy_run(f"http://127.0.0.1:{server.server_port}", log, "--tasks", str(tasks),
                             "--task-id-field", "id", "--command", "echo 1", "--resume")
    finally:
        server.shutdown()
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines() == [
        f"rlproxy run: GET /rollouts/r1?calls=false: proxy answered 503 ({{}}); `--resume` goes on from {log}"]


def test_resuming_from_a_log_that_does_not_exist_is_refused_before_anything_starts(tmp_path):
    """A mistyped --log with --resume would run every attempt again: it is said, and nothing runs."""
    tasks, mistyped = tmp_path / "tasks.jsonl", tmp_path / "rnu.jsonl"
    tasks.write_text('{"id": "a"}\n')
    result = rlproxy_run(NO_PROXY, mistyped, "--tasks", str(tasks), "--command", "echo 1", "--resume")
    refused(result, f"--resume: the log {mistyped} does not exist, so there is nothing to resume from: check its "
                    "name (--log), or leave out --resume to start a run")
    assert not mistyped.exists()


def test_a_proxy_url_that_reaches_another_server_says_what_answered(proxy_url, stub_url, tmp_path):
    """The proxy's OpenAI base URL (…/v1) or the engine's own URL as --proxy: a server answers, only not as the
    proxy does. It says so, and what --proxy is, instead of "does not answer"."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "a"}\n')
    for given, says in (
            (f"{proxy_url}/v1", f"rlproxy run: the server at {proxy_url}/v1 answered GET /healthz with 404, where "
                                f"the proxy answers 200: --proxy is the proxy's root URL, without /v1 (--proxy "
                                f"{proxy_url})"),
            (stub_url, f"rlproxy run: the server at {stub_url} answered GET /healthz with 404, where the proxy "
                       "answers 200: is it the engine (vLLM) or another server? --proxy is the proxy's root URL, "
                       "where `rlproxy serve` listens (no /v1), not the engine's")):
        result = rlproxy_run(given, tmp_path / "log.jsonl", "--tasks", str(tasks), "--command", "echo 1")
        assert result.exit_code == 1 and result.output.strip().splitlines() == [says], result.output
    nothing = rlproxy_run(NO_PROXY, tmp_path / "log.jsonl", "--tasks", str(tasks), "--command", "echo 1")
    assert nothing.exit_code == 1 and nothing.output.strip() == (
        f"rlproxy run: the proxy at {NO_PROXY} does not answer (GET /healthz): is `rlproxy serve` running there?")
