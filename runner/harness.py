"""`--harness claude-code|codex`: a coding-agent harness run per attempt in a fresh working folder (a copy of
`--workdir`, or a clone of the git repository a task field names), pointed at the rollout (its base URL, the
model name), given the prompt from a task field; then `--verify` runs in that folder and its result is the
reward: a number on its last line of output, else 1.0 for exit status 0 and 0.0 for any other."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from runner.agents import AgentResult, ClientConfig, base_env, failure, last_number, run_process
from runner.errors import RunInputError

INSTALL = {"claude-code": ("claude", "npm install -g @anthropic-ai/claude-code"),
           "codex": ("codex", "npm install -g @openai/codex")}
CLAUDE_TOOLS = "Bash,Edit,Write,Read,Glob,Grep"
# What could point a harness somewhere else than the rollout, left out of its environment.
FOREIGN = ("OPENAI_", "ANTHROPIC_", "CLAUDE_", "CODEX_")


def find_harness(kind: str) -> str:
    """The harness's executable: on PATH, or in this environment's node folder (scripts/install.sh)."""
    program, install = INSTALL[kind]
    found = shutil.which(program) or shutil.which(program, path=str(Path(sys.prefix) / "node" / "node_modules" / ".bin"))
    if found is None:
        raise RunInputError(f"--harness {kind}: `{program}` is not installed ({install})")
    return found


class HarnessAgent:
    def __init__(self, kind: str, prompt_field: str, verify: str | None, workdir: Path | None,
                 repo_field: str | None, extra_args: tuple[str, ...] = ()) -> None:
        if not verify:
            raise RunInputError(f"--harness {kind} needs --verify COMMAND: its result in the working folder is "
                                "the reward")
        if workdir is not None and not workdir.is_dir():
            raise RunInputError(f"--workdir {workdir}: not a folder")
        self.kind, self.program = kind, find_harness(kind)
        self.prompt_field, self.verify, self.workdir, self.repo_field = prompt_field, verify, workdir, repo_field
        self.extra_args = list(extra_args)

    def needed_fields(self) -> dict[str, str]:
        """The task fields it reads, each with the flag naming it."""
        return {self.prompt_field: "--prompt-field", **({self.repo_field: "--repo-field"} if self.repo_field else {})}

    async def run(self, task: dict[str, Any], config: ClientConfig, env: dict[str, str]) -> AgentResult:
        root = Path(tempfile.mkdtemp(prefix="rlproxy-run-"))
        try:
            work, home = root / "work", root / "home"
            home.mkdir()
            error = await self._prepare(work, task)
            if error:
                return AgentResult(error=error)
            clean = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN)}
            clean.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), NO_COLOR="1")
            argv, own = self._command(str(task[self.prompt_field]), config, work, home)
            code, _, err = await run_process(argv, {**own, **env}, cwd=str(work), inherit=clean)
            if code != 0:
                return AgentResult(error=f"{self.kind} {failure(code, err)}")
            code, out, _ = await run_process(self.verify, {**base_env(config, task), **env}, cwd=str(work))
            score = last_number(out)
            return AgentResult(score if score is not None else (1.0 if code == 0 else 0.0))
        finally:
            shutil.rmtree(root, ignore_errors=True)

    async def _prepare(self, work: Path, task: dict[str, Any]) -> str | None:
        if self.repo_field:
            code, _, err = await run_process(["git", "clone", "--quiet", "--depth", "1",
                                              str(task[self.repo_field]), str(work)], {})
            return None if code == 0 else f"git clone {task[self.repo_field]}: {failure(code, err)}"
        if self.workdir is not None:
            shutil.copytree(self.workdir, work, symlinks=True)
        else:
            work.mkdir()
        return None

    def _command(self, prompt: str, config: ClientConfig, work: Path,
                 home: Path) -> tuple[list[str], dict[str, str]]:
        if self.kind == "claude-code":
            env = {"ANTHROPIC_BASE_URL": config.anthropic_base_url, "ANTHROPIC_API_KEY": config.api_key,
                   "ANTHROPIC_MODEL": config.model, "ANTHROPIC_SMALL_FAST_MODEL": config.model,
                   "CLAUDE_CONFIG_DIR": str(home / ".claude"), "DISABLE_TELEMETRY": "1",
                   "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1",
                   "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
            # -p mode denies tools not allowed up front; the fresh folder is the sandbox (as for Codex below)
            return [self.program, "-p", prompt, "--output-format", "json", "--allowedTools", CLAUDE_TOOLS,
                    *self.extra_args], env
        codex_home = home / "codex"
        codex_home.mkdir()
        (codex_home / "config.toml").write_text(
            f'model = "{config.model}"\nmodel_provider = "rlproxy"\n\n[model_providers.rlproxy]\n'
            f'name = "rlproxy"\nbase_url = "{config.openai_base_url}"\nwire_api = "responses"\n'
            'env_key = "RLPROXY_API_KEY"\n')
        env = {"CODEX_HOME": str(codex_home), "RLPROXY_API_KEY": config.api_key}
        # Codex's own sandbox needs user namespaces that many containers lack: the fresh folder is the sandbox.
        return [self.program, "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
                "--json", "-C", str(work), *self.extra_args, prompt], env
