"""An agent that tries to reach what `rlproxy run` keeps to itself, as an agent whose shell runs what a model wrote
could: the files named in $REACH_TARGETS (JSON: name -> path: the journal, the task files, a key file), another
attempt's task file and its environment
(attempts meet through the shared folder $REACH_SHARED, as agents of one machine always can; the test puts the
runner's pid there), /proc/<pid>/environ of its parent and of the runner (the runner's key is in the runner's), the runner's mem, working folder
and descriptors through /proc, the descriptors it inherited, a symbolic and a hard link to the journal made in its
own HOME, a forged journal line, removing the task file, a signal to the runner; it leaves a `setsid` sleeper
behind. It writes what it found to $REACH_OUT/<rollout id>.json, asks the model once (the call is recorded) and
prints 1. `Reach` is the same as an Agent Lightning agent class, `reach` as an `--agent` function."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from openai import OpenAI


def read(path: str) -> str:
    try:
        with open(path, "rb") as file:
            return "read: " + file.read(200).decode(errors="replace")
    except OSError as exc:
        return f"refused: {exc.strerror}"


def write(path: str) -> str:
    try:
        with open(path, "ab") as file:
            file.write(b'{"event": "finished", "forged": true}\n')
        return "written"
    except OSError as exc:
        return f"refused: {exc.strerror}"


def runner_pid(shared: Path) -> int:
    """The runner's pid, as the test that started it told (its /proc files are not the agent's to search)."""
    deadline = time.monotonic() + 10
    while not (shared / "runner.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return int((shared / "runner.pid").read_text())


def environ_of(pid: int) -> str:
    try:
        data = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError as exc:
        return f"refused: {exc.strerror}"
    return "read: " + data.replace(b"\0", b"\n").decode(errors="replace").strip()


def links(home: Path, journal: str) -> dict[str, str]:
    found = {}
    try:
        (home / "to-journal").symlink_to(journal)
        found["symlink"] = read(str(home / "to-journal"))
    except OSError as exc:
        found["symlink"] = f"refused: {exc.strerror}"
    try:
        os.link(journal, home / "journal-link")
        found["hardlink"] = read(str(home / "journal-link"))
    except OSError as exc:
        found["hardlink"] = f"refused: {exc.strerror}"
    return found


def others_task(shared: Path, own: str) -> dict[str, str]:
    """Another attempt's task file, as that attempt told its path."""
    (shared / f"{os.getpid()}.path").write_text(own)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        seen = {p.stem: p.read_text() for p in shared.glob("*.path") if p.read_text() not in ("", own)}
        if seen:  # its task file, and its environment (RLPROXY_TASK holds the task, OPENAI_API_KEY its token)
            return {**{path: read(path) for path in seen.values()},
                    **{f"/proc/{pid}/environ": read(f"/proc/{pid}/environ") for pid in seen}}
        time.sleep(0.1)
    return {}


def probe(model_url: str | None, key: str, rollout: str) -> dict:
    """`model_url` None: a harness's shell tool (the harness makes the calls; its task is not written yet)."""
    targets = json.loads(os.environ["REACH_TARGETS"])
    shared, out = Path(os.environ["REACH_SHARED"]), Path(os.environ["REACH_OUT"])
    found: dict = {"files": {name: read(path) for name, path in targets.items()}}
    own = os.environ.get("RLPROXY_TASK_FILE") or str(Path.cwd() / "no-task-yet")
    found["own_task"] = read(own) if model_url else "read: (a harness's)"
    found["other_tasks"] = others_task(shared, own) if model_url else {}
    runner = runner_pid(shared)
    found["runner"] = runner
    found["environ"] = {str(pid): environ_of(pid) for pid in {os.getppid(), runner}}
    fds = {}
    for fd in range(3, 256):  # what it inherited beyond its standard input, output and error
        try:
            os.fstat(fd)
        except OSError:
            continue
        try:
            fds[str(fd)] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            fds[str(fd)] = "open"
    found["fds"] = fds
    found["links"] = links(Path(os.environ["HOME"]), targets["journal"])
    try:
        found["listing"] = sorted(os.listdir(os.path.dirname(targets["journal"])))
    except OSError as exc:
        found["listing"] = f"refused: {exc.strerror}"
    # its memory, the journal through its root, each descriptor it holds open (the journal's among them)
    found["runner_proc"] = {"mem": read(f"/proc/{runner}/mem"),
                            "root": read(f"/proc/{runner}/root{targets['journal']}")}
    try:
        for fd in os.listdir(f"/proc/{runner}/fd"):
            found["runner_proc"][f"fd {fd}"] = read(f"/proc/{runner}/fd/{fd}")
    except OSError as exc:
        found["runner_proc"]["fd"] = f"refused: {exc.strerror}"
    found["forge"] = write(targets["journal"])  # a forged journal line
    try:
        os.unlink(targets["tasks"])
        found["unlink"] = "removed"
    except OSError as exc:
        found["unlink"] = f"refused: {exc.strerror}"
    try:
        os.kill(runner, 0)
        found["signal"] = "sent"
    except OSError as exc:
        found["signal"] = f"refused: {exc.strerror}"
    sleeper = subprocess.Popen(["setsid", "sleep", "300"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    found["sleeper"] = sleeper.pid
    if model_url:
        reply = OpenAI(base_url=model_url, api_key=key, max_retries=0).chat.completions.create(
            model="auto", max_tokens=4, messages=[{"role": "user", "content": "What is 3+4?"}])
        found["answered"] = bool(reply.choices)
    (out / f"{rollout}.json").write_text(json.dumps(found))
    return found


class Reach:
    def run(self) -> None:
        rollout = os.environ["AGL_OPENAI_BASE_URL"].split("/rollouts/")[1].split("/")[0]
        probe(os.environ["AGL_OPENAI_BASE_URL"], os.environ["AGL_KEY"], rollout)


def reach(task: dict, config) -> float:
    """The same as an `--agent` function (runner/function_agent.py runs it in a process of its own)."""
    probe(config.openai_base_url, config.api_key, config.rollout_id)
    return 1.0


if __name__ == "__main__" and sys.argv[1:] == ["harness"]:  # the harness's shell tool: its rollout from its URL
    base = os.environ.get("ANTHROPIC_BASE_URL") or json.dumps(os.environ.get("CODEX_HOME"))
    rollout = base.split("/rollouts/")[1].split("/")[0] if "/rollouts/" in base else str(os.getpid())
    probe(None, "", f"{rollout}-harness")
    print("rlproxy-ok")
elif __name__ == "__main__":
    probe(os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"], os.environ["RLPROXY_ROLLOUT_ID"])
    print(1)
    sys.exit(0)
