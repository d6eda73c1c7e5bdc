"""Claude Code (npm `@anthropic-ai/claude-code`): Anthropic Messages at the rollout's base URL, set by its
variables; `claude -p` reads the prompt from standard input when it is given no prompt argument."""
from __future__ import annotations

from runner.harnesses.base import Attempt, Harness
from runner.harnesses.installed import NODE, Pin

TOOLS = "Bash,Edit,Write,Read,Glob,Grep"
# Only the fresh home's settings (`user`); not the working folder's (`project`, `local`): a task's repository
# with a .claude/settings.json hook would otherwise run it before any model call.
SETTINGS = ("--setting-sources", "user", "--strict-mcp-config")


class ClaudeCode(Harness):
    name = "claude-code"
    pin = Pin("claude", "@anthropic-ai/claude-code", "2.1.330", NODE)

    def command(self, attempt: Attempt) -> tuple[list[str], dict[str, str]]:
        config, home = attempt.config, attempt.home
        env = {"ANTHROPIC_BASE_URL": config.anthropic_base_url, "ANTHROPIC_API_KEY": config.api_key,
               "ANTHROPIC_MODEL": config.model, "ANTHROPIC_SMALL_FAST_MODEL": config.model,
               "CLAUDE_CONFIG_DIR": str(home / ".claude"), "DISABLE_TELEMETRY": "1",
               "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1",
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
        # -p mode denies tools not allowed up front; the fresh folder is the sandbox (as for Codex).
        return [attempt.program, "-p", "--output-format", "json", "--allowedTools", TOOLS, *SETTINGS,
                *attempt.extra_args], env
