"""What the tests of `rlproxy run` share: the example task file, the command run in this process, and its log and
rollouts read back (the finished attempts, a rollout as the proxy stored it), and task files written for a test."""
from __future__ import annotations

import json
from pathlib import Path

import requests
from click.testing import CliRunner

from rlproxy.cli import main
from tests.support import ROOT

TASKS = ROOT / "examples" / "run_tasks.jsonl"  # six arithmetic questions with their answers


def rlproxy_run(proxy_url: str, log: Path, *args: str, env: dict[str, str] | None = None):
    """`rlproxy run` in this process (its agents and the proxy are real; only the command is not a new process);
    `env`: variables it reads, its keys among them (`RLPROXY_API_KEY`: no key is taken on the command line)."""
    result = CliRunner().invoke(main, ["run", "--proxy", proxy_url, "--log", str(log), *args], env=env,
                                catch_exceptions=False)
    return result


def finished(log: Path) -> list[dict]:
    return [entry for entry in map(json.loads, log.read_text().splitlines()) if entry["event"] == "finished"]


def stored(proxy_url: str, rollout_id: str) -> dict:
    answer = requests.get(f"{proxy_url}/rollouts/{rollout_id}", timeout=10)
    answer.raise_for_status()
    return answer.json()


def write_tasks(path: Path, *tasks: dict) -> Path:
    # json.dumps escapes NULs and lone surrogates as \u0000 and \ud800: the file is valid JSON lines
    path.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return path
