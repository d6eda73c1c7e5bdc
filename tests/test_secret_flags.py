"""No secret on a command line: every process of the machine reads one (`/proc/PID/cmdline`, `ps`), an agent run by
`rlproxy run` included. Each command's keys, and a database URL holding a password, are refused there (and in
`--set`) with the way to give them instead: the `RLPROXY_*` variable, or a file (`--api-key-file PATH`). Run as
a user runs them: the real CLI, a real `rlproxy run` process whose agent looks for the key in its ancestors'
command lines."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rlproxy.cli import main
from testkit.processes import rlproxy_command

SECRET = "rlp_" + "s" * 43  # shaped as a key
WITH_PASSWORD = "postgresql+asyncpg://rlproxy:hunter2@127.0.0.1:5432/rlproxy"

# A setting each command refuses once it has read its flags: a command that took the secret stops there at once,
# rather than serving or training, while the refusal of the secret comes first
FAILS_LATER = {"run": ["--tasks", "t.jsonl", "--command", "true", "--attempts", "0"],
               "serve": ["--writer-batch-size", "0"], "train": ["--learning-rate", "-1"], "eval": ["--tasks", "0"]}
REFUSED = [
    (["run", *FAILS_LATER["run"], "--api-key", SECRET], "RLPROXY_API_KEY", "--api-key-file"),
    (["run", *FAILS_LATER["run"], "--agent-api-key", SECRET], "RLPROXY_AGENT_API_KEY",
     "--agent-api-key-file"),
    (["serve", *FAILS_LATER["serve"], "--admin-key", SECRET], "RLPROXY_ADMIN_KEY", "--admin-key-file"),
    (["serve", *FAILS_LATER["serve"], "--upstream-api-key", SECRET], "RLPROXY_UPSTREAM_API_KEY",
     "--upstream-api-key-file"),
    (["engine", "--engine-key", SECRET], "RLPROXY_ENGINE_KEY", "--engine-key-file"),
    (["train", *FAILS_LATER["train"], "--judge-api-key", SECRET], "RLPROXY_JUDGE_API_KEY", "--judge-api-key-file"),
    (["train", *FAILS_LATER["train"], "--set", f"upstream_api_key={SECRET}"], "RLPROXY_UPSTREAM_API_KEY",
     "--upstream-api-key-file"),
    (["eval", "--policy", "v1", *FAILS_LATER["eval"], "--api-key", SECRET], "RLPROXY_API_KEY", "--api-key-file"),
    (["serve", *FAILS_LATER["serve"], "--database-url", WITH_PASSWORD], "RLPROXY_DATABASE_URL", "PGPASSWORD"),
    (["migrate", "--database-url", WITH_PASSWORD.replace("hunter2", SECRET)], "RLPROXY_DATABASE_URL",
     "--database-url-file"),
    (["train", *FAILS_LATER["train"], "--database-url", f"postgresql+asyncpg://127.0.0.1/db?password={SECRET}"],
     "RLPROXY_DATABASE_URL", "--database-url-file"),
]


def named(args: list[str]) -> str:
    return " ".join(arg for arg in args if SECRET not in arg and "hunter2" not in arg)


@pytest.mark.parametrize("args, variable, instead", REFUSED, ids=[named(args) for args, _, _ in REFUSED])
def test_a_secret_on_the_command_line_is_refused_saying_where_it_goes(args, variable, instead):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert variable in result.output and instead in result.output, result.output
    assert SECRET not in result.output and "hunter2" not in result.output  # not echoed either


def test_the_refusal_comes_before_anything_starts_in_a_real_process(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "one"}) + "\n")
    done = subprocess.run(rlproxy_command("run", "--proxy", "http://127.0.0.1:9", "--tasks", str(tasks),
                                          "--log", str(tmp_path / "run.jsonl"), "--command", "echo 1",
                                          "--api-key", SECRET), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "set RLPROXY_API_KEY or give --api-key-file FILE" in done.stderr, done.stderr
    assert not (tmp_path / "run.jsonl").exists()  # no attempt, no log


def settings_of(args: list[str]):
    """The settings `rlproxy serve <args>` would run with, as the command builds them (no server started)."""
    from rlproxy.commands.serve import SERVE_FLAGS, serve

    with serve.make_context("serve", ["--auth", "off", *args]) as context:
        return SERVE_FLAGS.build(context.params)


def test_a_secret_comes_from_its_variable_or_its_file(tmp_path, monkeypatch):
    key_file = tmp_path / "admin-key"
    key_file.write_text(SECRET + "\n")  # as `echo` or a mounted Secret writes it: the line break is not the key
    for name in ("RLPROXY_ADMIN_KEY", "RLPROXY_ADMIN_KEY_FILE", "RLPROXY_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    from_file = settings_of(["--admin-key-file", str(key_file)])
    assert from_file.auth.admin_key.get_secret_value() == SECRET
    monkeypatch.setenv("RLPROXY_ADMIN_KEY_FILE", str(key_file))
    assert settings_of([]).auth.admin_key.get_secret_value() == SECRET
    monkeypatch.setenv("RLPROXY_ADMIN_KEY", "rlp_other")  # a variable and a file: which one wins would be a guess
    with pytest.raises(Exception, match="RLPROXY_ADMIN_KEY both give --admin-key"):
        settings_of([])
    monkeypatch.delenv("RLPROXY_ADMIN_KEY_FILE")
    assert settings_of([]).auth.admin_key.get_secret_value() == "rlp_other"
    monkeypatch.delenv("RLPROXY_ADMIN_KEY")
    # a database URL without a password is no secret: the command line takes it, as the tests' own do
    plain = "postgresql+asyncpg://postgres@127.0.0.1:5432/rlproxy"
    assert settings_of(["--database-url", plain]).database_url == plain
    url_file = tmp_path / "url"
    url_file.write_text(WITH_PASSWORD)
    assert settings_of(["--database-url-file", str(url_file)]).database_url == WITH_PASSWORD
    (tmp_path / "two").write_text("a\nb\n")
    with pytest.raises(Exception, match="expected the value on one line"):
        settings_of(["--admin-key-file", str(tmp_path / "two")])


def test_an_agent_finds_no_key_on_its_runners_command_line(tenants, tmp_path):
    """A real `rlproxy run` given its key in a file: the agent, a program a model could have written, reads the
    command line of every process above it (the shell, the runner) and finds no key there."""
    key = tenants.keys["alpha"]
    key_file = tmp_path / "runner-key"
    key_file.write_text(key + "\n")
    looker = tmp_path / "look.py"
    looker.write_text(
        "import os, sys\n"
        f"key = {key!r}.encode()\n"
        "pid, seen = os.getppid(), []\n"
        "while pid > 1:\n"
        "    seen.append(open(f'/proc/{pid}/cmdline', 'rb').read())\n"
        "    pid = int(open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[1])\n"
        "assert any(b'rlproxy.cli' in line for line in seen), seen  # the runner is among them\n"
        "print(0.0 if any(key in line for line in seen) else 1.0)\n")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "look"}) + "\n")
    log = tmp_path / "run.jsonl"
    done = subprocess.run(rlproxy_command("run", "--proxy", tenants.url, "--tasks", str(tasks), "--log", str(log),
                                          "--attempts", "1", "--api-key-file", str(key_file),
                                          "--command", f"{sys.executable} {looker}"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    [finished] = [entry for entry in map(json.loads, log.read_text().splitlines()) if entry["event"] == "finished"]
    assert finished["status"] == "rewarded" and finished["reward"] == 1.0, finished
    assert Path(key_file).read_text().strip() == key
