"""Codex CLI (npm `@openai/codex`): OpenAI Responses. Codex 0.118+ ignores `OPENAI_BASE_URL`, so the rollout is a
model provider of its `config.toml` in a fresh `CODEX_HOME`."""
from __future__ import annotations

from runner.harnesses.base import Attempt, Harness, toml_string
from runner.harnesses.installed import NODE, Pin


class Codex(Harness):
    name = "codex"
    pin = Pin("codex", "@openai/codex", "0.169.0", NODE)

    def command(self, attempt: Attempt) -> tuple[list[str], dict[str, str]]:
        config, codex_home = attempt.config, attempt.home / "codex"
        codex_home.mkdir()
        (codex_home / "config.toml").write_text(
            f"model = {toml_string(config.model)}\nmodel_provider = \"rlproxy\"\n\n[model_providers.rlproxy]\n"
            f"name = \"rlproxy\"\nbase_url = {toml_string(config.openai_base_url)}\nwire_api = \"responses\"\n"
            "env_key = \"OPENAI_API_KEY\"\n")
        env = {"CODEX_HOME": str(codex_home), "OPENAI_API_KEY": config.api_key}
        # Codex's own sandbox needs user namespaces that many containers lack: the fresh folder is the sandbox.
        # `-- -`: the prompt is read from standard input (a prompt argument could also name a subcommand).
        return [attempt.program, "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
                "--json", "-C", str(attempt.work), *attempt.extra_args, "--", "-"], env
