"""Gemini CLI (npm `@google/gemini-cli`): the Gemini API at `GOOGLE_GEMINI_BASE_URL`, the rollout's URL without
`/v1` (it adds `/v1beta/models/NAME:streamGenerateContent?alt=sse` itself), with the rollout's token as
`GEMINI_API_KEY` (sent as `x-goog-api-key`). Given no prompt argument and standard input that is not a terminal,
it runs one task non-interactively with the prompt read from standard input; `--approval-mode yolo` approves its
tools (the fresh folder is the sandbox, as for Codex) and `--skip-trust` trusts the working folder, which a
non-interactive run otherwise refuses (so a task repository's own `.gemini/` settings are read: docs/run.md).

The model: Gemini CLI routes the name `auto` (and any alias that resolves to it) to Google's own models, so for
the rollout's policy (`--model auto`) it is given the engine's served model name, which the proxy routes as it
routes `auto`: read from the rollout's model list (its first model that is no adapter).

Offline: its settings file in the attempt's home selects the API-key auth and turns off automatic updates and their
notice, usage statistics and telemetry; `GEMINI_CLI_NO_RELAUNCH` keeps it from starting itself again in a second
node."""
from __future__ import annotations

import json
import urllib.request

from runner.errors import RunInputError
from runner.harnesses.base import Attempt, Harness
from runner.harnesses.installed import NODE, Pin

SETTINGS = {"security": {"auth": {"selectedType": "gemini-api-key"}},
            "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
            "privacy": {"usageStatisticsEnabled": False}, "telemetry": {"enabled": False}}
AUTO = "auto"


def served_model(openai_base_url: str, key: str) -> str:
    """The engine's base model as the rollout's model list names it (vLLM lists adapters with a `parent`)."""
    request = urllib.request.Request(f"{openai_base_url}/models", headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 — the proxy's own URL
            listing = json.load(answer)
    except (OSError, ValueError) as exc:
        raise RunInputError(f"--harness gemini-cli: the rollout's model list could not be read ({exc}); give "
                            "--model the served model's name") from None
    for model in listing.get("data") or () if isinstance(listing, dict) else ():
        if isinstance(model, dict) and isinstance(model.get("id"), str) and not model.get("parent"):
            return model["id"]
    raise RunInputError("--harness gemini-cli: the rollout's model list names no base model; give --model the "
                        "served model's name")


class GeminiCli(Harness):
    name = "gemini-cli"
    pin = Pin("gemini", "@google/gemini-cli", "0.61.0", NODE)

    def command(self, attempt: Attempt) -> tuple[list[str], dict[str, str]]:
        config, folder = attempt.config, attempt.home / ".gemini"
        folder.mkdir()
        (folder / "settings.json").write_text(json.dumps(SETTINGS))
        model = served_model(config.openai_base_url, config.api_key) if config.model == AUTO else config.model
        env = {"GOOGLE_GEMINI_BASE_URL": config.anthropic_base_url, "GEMINI_API_KEY": config.api_key,
               "GEMINI_CLI_NO_RELAUNCH": "true"}
        return [attempt.program, "--model", model, "--approval-mode", "yolo", "--skip-trust", "--output-format",
                "json", *attempt.extra_args], env
