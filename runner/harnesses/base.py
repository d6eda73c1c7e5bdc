"""`--harness NAME`: a coding-agent harness run per attempt in a fresh working folder (a copy of `--workdir`, or
a clone of the git repository a task field names) with a fresh `HOME`, pointed at the rollout (its base URL, the
model name) by the configuration its module writes there, given the prompt from a task field; then `--verify`
runs in that folder and its result is the reward: a number on its last line of output, else 1.0 for exit status
0 and 0.0 for any other.

What every harness shares lives here (the folders, the environment allow-list, the process clean-up of
runner/agents.py's `run_process`, the verifier); what differs (its command line, its configuration files, its
offline switches, its pinned version) is one `Harness` per module beside this one.

Task values reach these programs only as data: the prompt on the harness's standard input, or in a file it is
told to read (so a prompt such as `--settings={"hooks": ...}` is text, whatever its size), the repository after
`--` of `git clone`, the task in a file for `--verify`."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.agents import AgentResult, ClientConfig, failure, last_number, rollout_env, run_process
from runner.environment import inherited
from runner.errors import RunInputError, TaskDataError
from runner.harnesses.installed import Pin, find_program
from runner.identity import AgentUser
from runner.leftovers import end_leftovers_of
from runner.task_data import checked_text, task_json, task_variables

# git transports a task's repository may name; `ext::` and other helpers run commands (deny by default)
GIT_PROTOCOLS = ("https", "http", "ssh", "git", "file")
STDIN, FILE = "stdin", "file"  # where a harness reads its prompt


@dataclass(frozen=True)
class Attempt:
    """What a harness module writes its configuration from: the rollout and the attempt's own folders."""

    program: str  # the pinned executable (runner/harnesses/installed.py)
    config: ClientConfig
    work: Path  # the working folder the harness starts in
    home: Path  # its HOME: fresh, nothing of the runner's user is read
    prompt_file: Path  # the prompt, when the harness reads it from a file (Harness.prompt == FILE)
    extra_args: tuple[str, ...]  # --harness-args


class Harness:
    """One harness: how it is started and configured. A module per harness subclasses it."""

    name: str
    pin: Pin
    prompt: str = STDIN
    prompt_name: str = "prompt.txt"  # the prompt file's name, in the attempt's home

    def command(self, attempt: Attempt) -> tuple[list[str], dict[str, str]]:
        """Its command line (no task value in it) and its own variables, over the allow-listed ones; writes the
        configuration files it needs into `attempt.home` or `attempt.work`."""
        raise NotImplementedError

    def check(self, program: str) -> None:
        """Refuses (RunInputError) before the run what its pin cannot tell: a runtime it needs beside it."""

    def shared_folders(self, uid: int) -> tuple[Path, ...]:
        """Folders it writes outside its attempt's own, shared by its attempts (a lock folder fixed in its code),
        made for `uid`, whom its attempts run as: where the run confines its agents, they may (as --agent-write)."""
        return ()

    def prompt_file_text(self, prompt: str) -> str:
        """What the prompt file holds (Harness.prompt == FILE): the prompt, or a configuration file holding it."""
        return prompt


def git_clone(source: str, into: Path) -> list[str]:
    """`git clone` of a task's repository: after `--`, so a value such as `--upload-pack=...` is a path."""
    protocols = [f"protocol.{name}.allow=always" for name in GIT_PROTOCOLS]
    config = [arg for setting in ("protocol.allow=never", *protocols) for arg in ("-c", setting)]
    return ["git", *config, "clone", "--quiet", "--depth", "1", "--", source, str(into)]


def toml_string(value: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(value)


def fresh_home(home: Path) -> dict[str, str]:
    """The variables that keep a harness in its attempt's home (the XDG folders default to it: the allow-list
    passes none of the runner's)."""
    return {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "NO_COLOR": "1"}


class HarnessAgent:
    def __init__(self, harness: Harness, prompt_field: str, verify: str | None, workdir: Path | None,
                 repo_field: str | None, extra_args: tuple[str, ...] = (), pass_env: tuple[str, ...] = (),
                 user: AgentUser | None = None) -> None:
        self.kind = harness.name
        if not verify:
            raise RunInputError(f"--harness {self.kind} needs --verify COMMAND: its result in the working folder "
                                "is the reward")
        if workdir is not None and not workdir.is_dir():
            raise RunInputError(f"--workdir {workdir}: not a folder")
        self.harness, self.program = harness, find_program(harness.name, harness.pin)
        harness.check(self.program)
        self.shared_folders = harness.shared_folders(user.uid if user is not None else os.getuid())
        self.prompt_field, self.verify, self.workdir, self.repo_field = prompt_field, verify, workdir, repo_field
        self.extra_args, self.pass_env, self.user = tuple(extra_args), pass_env, user

    def needed_fields(self) -> dict[str, str]:
        """The task fields it reads, each with the flag naming it."""
        return {self.prompt_field: "--prompt-field", **({self.repo_field: "--repo-field"} if self.repo_field else {})}

    def check_task(self, task: dict[str, Any]) -> None:
        """Refuses (TaskDataError) a task whose prompt, repository or JSON cannot be handed over as text."""
        checked_text(task[self.prompt_field], f"the prompt (task field {self.prompt_field!r})")
        if self.repo_field:
            source = task[self.repo_field]
            if not isinstance(source, str) or not source.strip():
                raise TaskDataError(f"task field {self.repo_field!r} (--repo-field) is not a repository URL or path")
            checked_text(source, f"task field {self.repo_field!r} (--repo-field)")
        task_json(task)

    async def run(self, task: dict[str, Any], config: ClientConfig, env: dict[str, str]) -> AgentResult:
        root = Path(tempfile.mkdtemp(prefix="rlproxy-run-"))
        try:
            work, home = root / "work", root / "home"
            home.mkdir()
            error = await self._prepare(work, task)
            if error:
                return AgentResult(error=error)
            base = {**inherited(self.pass_env), **env, **(self.user.variables() if self.user else {})}
            text = checked_text(task[self.prompt_field], "the prompt")
            prompt = text.encode("utf-8")
            attempt = Attempt(self.program, config, work, home, home / self.harness.prompt_name, self.extra_args)
            argv, own = self.harness.command(attempt)
            stdin: bytes | None = prompt
            if self.harness.prompt == FILE:  # in its home, not the working folder: not part of what is verified
                attempt.prompt_file.write_text(self.harness.prompt_file_text(text), encoding="utf-8")
                stdin = None
            if self.user is not None:  # its working folder and home, the attempt's alone
                self.user.give(root)
            code, _, err = await run_process(argv, {**base, **fresh_home(home), **own}, cwd=str(work), stdin=stdin,
                                             user=self.user)
            # What it left running (`setsid cmd &` leaves its process group) would go on changing the folder while
            # the verifier reads it: the reward must come from what the harness had done when it ended.
            await asyncio.to_thread(end_leftovers_of, config.api_key, root)
            if code != 0:
                return AgentResult(error=f"{self.kind} {failure(code, err)}")
            # the task (the verifier's answer key, say) is written only now that the harness is done
            variables = {**base, **rollout_env(config), **task_variables(task, root)}
            if self.user is not None:
                self.user.give(root / "task.json")
            code, out, _ = await run_process(self.verify, variables, cwd=str(work), user=self.user)
            score = last_number(out)
            return AgentResult(score if score is not None else (1.0 if code == 0 else 0.0))
        finally:
            await asyncio.to_thread(end_leftovers_of, config.api_key, root)  # the verifier's too
            shutil.rmtree(root, ignore_errors=True)

    async def _prepare(self, work: Path, task: dict[str, Any]) -> str | None:
        if self.repo_field:
            source = task[self.repo_field]
            # the runner's own tool: its environment (credentials for private repositories), never a prompt
            # the runner's own tool, not the agent's: unconfined (it writes the attempt's working folder)
            code, _, err = await run_process(git_clone(source, work), {**os.environ, "GIT_TERMINAL_PROMPT": "0"},
                                             confined=False)
            return None if code == 0 else f"git clone {source!r}: {failure(code, err)}"
        if self.workdir is not None:
            shutil.copytree(self.workdir, work, symlinks=True)
        else:
            work.mkdir()
        return None
