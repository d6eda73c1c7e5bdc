"""`--harness claude-code|codex`: a coding-agent harness run per attempt in a fresh working folder (a copy of
`--workdir`, or a clone of the git repository a task field names), pointed at the rollout (its base URL, the
model name), given the prompt from a task field; then `--verify` runs in that folder and its result is the
reward: a number on its last line of output, else 1.0 for exit status 0 and 0.0 for any other.

Task values reach these programs only as data: the prompt on the harness's standard input (so a prompt such as
`--settings={"hooks": ...}` is text, whatever its size), the repository after `--` of `git clone`, the task in a
file for `--verify`. The working folder's own settings (`.claude/settings.json`, `.mcp.json`: a task's
repository is data) are not loaded."""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from runner.agents import AgentResult, ClientConfig, failure, last_number, rollout_env, run_process
from runner.environment import inherited
from runner.errors import RunInputError, TaskDataError
from runner.identity import AgentUser
from runner.task_data import checked_text, task_json, task_variables

INSTALL = {"claude-code": ("claude", "npm install -g @anthropic-ai/claude-code"),
           "codex": ("codex", "npm install -g @openai/codex")}
CLAUDE_TOOLS = "Bash,Edit,Write,Read,Glob,Grep"
# Only the fresh home's settings (`user`); not the working folder's (`project`, `local`): a task's repository
# with a .claude/settings.json hook would otherwise run it before any model call.
CLAUDE_SETTINGS = ("--setting-sources", "user", "--strict-mcp-config")
# git transports a task's repository may name; `ext::` and other helpers run commands (deny by default)
GIT_PROTOCOLS = ("https", "http", "ssh", "git", "file")


def find_harness(kind: str) -> str:
    """The harness's executable: on PATH, or in this environment's node folder (scripts/install.sh)."""
    program, install = INSTALL[kind]
    found = shutil.which(program) or shutil.which(program, path=str(Path(sys.prefix) / "node" / "node_modules" / ".bin"))
    if found is None:
        raise RunInputError(f"--harness {kind}: `{program}` is not installed ({install})")
    return found


def git_clone(source: str, into: Path) -> list[str]:
    """`git clone` of a task's repository: after `--`, so a value such as `--upload-pack=...` is a path."""
    protocols = [f"protocol.{name}.allow=always" for name in GIT_PROTOCOLS]
    config = [arg for setting in ("protocol.allow=never", *protocols) for arg in ("-c", setting)]
    return ["git", *config, "clone", "--quiet", "--depth", "1", "--", source, str(into)]


def toml_string(value: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(value)


class HarnessAgent:
    def __init__(self, kind: str, prompt_field: str, verify: str | None, workdir: Path | None,
                 repo_field: str | None, extra_args: tuple[str, ...] = (), pass_env: tuple[str, ...] = (),
                 user: AgentUser | None = None) -> None:
        if not verify:
            raise RunInputError(f"--harness {kind} needs --verify COMMAND: its result in the working folder is "
                                "the reward")
        if workdir is not None and not workdir.is_dir():
            raise RunInputError(f"--workdir {workdir}: not a folder")
        self.kind, self.program = kind, find_harness(kind)
        self.prompt_field, self.verify, self.workdir, self.repo_field = prompt_field, verify, workdir, repo_field
        self.extra_args, self.pass_env, self.user = list(extra_args), pass_env, user

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
            argv, own = self._command(config, work, home)
            prompt = checked_text(task[self.prompt_field], "the prompt").encode("utf-8")
            if self.user is not None:  # its working folder and home, the attempt's alone
                self.user.give(root)
            code, _, err = await run_process(argv, {**base, **own}, cwd=str(work), stdin=prompt, user=self.user)
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
            shutil.rmtree(root, ignore_errors=True)

    async def _prepare(self, work: Path, task: dict[str, Any]) -> str | None:
        if self.repo_field:
            source = task[self.repo_field]
            # the runner's own tool: its environment (credentials for private repositories), never a prompt
            code, _, err = await run_process(git_clone(source, work), {**os.environ, "GIT_TERMINAL_PROMPT": "0"})
            return None if code == 0 else f"git clone {source!r}: {failure(code, err)}"
        if self.workdir is not None:
            shutil.copytree(self.workdir, work, symlinks=True)
        else:
            work.mkdir()
        return None

    def _command(self, config: ClientConfig, work: Path, home: Path) -> tuple[list[str], dict[str, str]]:
        """The harness's command line (no task value in it: the prompt goes to its standard input) and its own
        variables, over the allow-listed ones."""
        fresh = {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "NO_COLOR": "1"}
        if self.kind == "claude-code":
            env = {**fresh, "ANTHROPIC_BASE_URL": config.anthropic_base_url, "ANTHROPIC_API_KEY": config.api_key,
                   "ANTHROPIC_MODEL": config.model, "ANTHROPIC_SMALL_FAST_MODEL": config.model,
                   "CLAUDE_CONFIG_DIR": str(home / ".claude"), "DISABLE_TELEMETRY": "1",
                   "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1",
                   "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
            # -p mode denies tools not allowed up front; the fresh folder is the sandbox (as for Codex below).
            # With no prompt argument, `claude -p` reads it from standard input.
            return [self.program, "-p", "--output-format", "json", "--allowedTools", CLAUDE_TOOLS, *CLAUDE_SETTINGS,
                    *self.extra_args], env
        codex_home = home / "codex"
        codex_home.mkdir()
        (codex_home / "config.toml").write_text(
            f"model = {toml_string(config.model)}\nmodel_provider = \"rlproxy\"\n\n[model_providers.rlproxy]\n"
            f"name = \"rlproxy\"\nbase_url = {toml_string(config.openai_base_url)}\nwire_api = \"responses\"\n"
            "env_key = \"OPENAI_API_KEY\"\n")
        env = {**fresh, "CODEX_HOME": str(codex_home), "OPENAI_API_KEY": config.api_key}
        # Codex's own sandbox needs user namespaces that many containers lack: the fresh folder is the sandbox.
        # `-- -`: the prompt is read from standard input (a prompt argument could also name a subcommand).
        return [self.program, "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
                "--json", "-C", str(work), *self.extra_args, "--", "-"], env
