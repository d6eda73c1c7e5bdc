"""Aider (PyPI `aider-chat`): Chat Completions through litellm, `openai/NAME` at `--openai-api-base`. It has
no shell tool: it edits files by the edit format it names in its system prompt (here `whole`: a file's
path, then its whole new text), and `--message-file` runs the one request and exits.

Trainable: aider sends `temperature: 0` to every model without a setting of its own (models.py's
`use_temperature`), and a greedy sample is no policy sample; the attempt's model settings file
(`--model-settings-file`) gives the rollout's model `use_temperature: false`, so the engine's default
temperature samples.

Offline and contained: no update check, release notes, analytics, model warnings or URL scraping; no git
(`--no-git`: no commits in the task's folder), histories in the attempt's home, not in its working folder.
Aider still reads `.aider.conf.yml`, `.env`, `.aider.model.settings.yml` and `.aider.model.metadata.json` from
its working folder and that folder's git root whatever it is told (main.py's search paths): what the command
line sets wins over them, but a task repository's `.env` can still set variables for it (docs/run.md)."""
from __future__ import annotations

import json

from runner.harnesses.base import FILE, Attempt, Harness
from runner.harnesses.installed import PYTHON, Pin

OFFLINE = ("--no-check-update", "--no-show-release-notes", "--analytics-disable", "--no-show-model-warnings",
           "--no-detect-urls", "--no-gitignore", "--disable-playwright")
QUIET = ("--no-pretty", "--no-fancy-input", "--no-suggest-shell-commands", "--no-auto-lint", "--no-auto-test",
         "--map-tokens", "0", "--no-restore-chat-history")


class Aider(Harness):
    name = "aider"
    pin = Pin("aider", "aider-chat", "0.86.2", PYTHON, venv="aider")
    prompt = FILE

    def command(self, attempt: Attempt) -> tuple[list[str], dict[str, str]]:
        config, home = attempt.config, attempt.home
        model = f"openai/{config.model}"
        settings = home / ".aider.model.settings.yml"
        # YAML reads JSON: one model's settings, the rollout's
        settings.write_text(json.dumps([{"name": model, "edit_format": "whole", "use_temperature": False}]))
        env = {"OPENAI_API_KEY": config.api_key, "LITELLM_LOCAL_MODEL_COST_MAP": "True",
               "LITELLM_OFFLINE_MODE": "true", "LITELLM_MODE": "PRODUCTION", "AIDER_ANALYTICS": "false"}
        return [attempt.program, "--model", model, "--openai-api-base", config.openai_base_url,
                "--model-settings-file", str(settings), "--edit-format", "whole",
                "--message-file", str(attempt.prompt_file), "--yes-always", "--no-git", *OFFLINE, *QUIET,
                "--input-history-file", str(home / ".aider.input.history"),
                "--chat-history-file", str(home / ".aider.chat.history.md"),
                "--llm-history-file", str(home / ".aider.llm.history"), "--env-file", str(home / ".env"),
                *attempt.extra_args], env
