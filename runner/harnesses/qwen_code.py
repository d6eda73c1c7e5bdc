"""Qwen Code (npm `@qwen-code/qwen-code`): Chat Completions at `OPENAI_BASE_URL` with `OPENAI_API_KEY` and
`OPENAI_MODEL` (its `openai` auth type). With no prompt argument and standard input not a terminal it runs one
task non-interactively, the prompt read from standard input; `--yolo` approves its tools (the fresh folder is
the sandbox, as for Codex).

Offline: its settings turn off automatic updates and their notice, usage statistics and telemetry. They are
its system settings (`QWEN_CODE_SYSTEM_SETTINGS_PATH`, a file in the attempt's home), which win over a working
folder's `.qwen/settings.json` (a task repository's) and keep the machine's `/etc/qwen-code/settings.json`
out; that folder's file is still read for what they do not set (docs/run.md)."""
from __future__ import annotations

import json

from runner.harnesses.base import Attempt, Harness
from runner.harnesses.installed import NODE, Pin

SETTINGS = {"general": {"enableAutoUpdate": False, "disableAutoUpdate": True, "disableUpdateNag": True},
            "privacy": {"usageStatisticsEnabled": False}, "telemetry": {"enabled": False},
            "security": {"auth": {"selectedType": "openai"}}}


class QwenCode(Harness):
    name = "qwen-code"
    pin = Pin("qwen", "@qwen-code/qwen-code", "0.24.4", NODE)

    def command(self, attempt: Attempt) -> tuple[list[str], dict[str, str]]:
        config, folder = attempt.config, attempt.home / ".qwen"
        folder.mkdir()
        settings = folder / "system-settings.json"
        settings.write_text(json.dumps(SETTINGS))
        env = {"QWEN_CODE_SYSTEM_SETTINGS_PATH": str(settings), "OPENAI_BASE_URL": config.openai_base_url,
               "OPENAI_API_KEY": config.api_key, "OPENAI_MODEL": config.model,
               "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1"}
        return [attempt.program, "--yolo", "--auth-type", "openai", "--output-format", "json",
                *attempt.extra_args], env
