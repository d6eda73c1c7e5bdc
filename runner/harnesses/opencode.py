"""OpenCode (npm `opencode-ai`): Chat Completions through the `@ai-sdk/openai-compatible` provider it bundles,
the rollout a provider of its global `opencode.json` (`options.baseURL`, the model under the provider's
`models`); `opencode run` with no message argument reads the task from standard input and runs it to its end.

It starts in `$PWD`, not in the process's working folder (a stale `PWD` ends it with "UnknownError" before any
call): PWD is the attempt's working folder.

Offline: no update check, no models.dev catalogue fetch, no LSP download, no sharing, no plugins
(`OPENCODE_PURE`, no default ones). At start it also installs `@opencode-ai/plugin` from the npm registry into
every configuration folder (for the custom tools a folder may hold) unless that folder's lock file already
lists it: the fresh configuration folder gets a `package-lock.json` that does, so nothing is fetched (no
custom tools are there).

Contained: the working folder's own configuration (`opencode.json`, `.opencode/`, `AGENTS.md`: a task's
repository is data) is not loaded (`OPENCODE_DISABLE_PROJECT_CONFIG`), nor `~/.claude` skills and prompts;
`--auto` approves its tools (the fresh folder is the sandbox, as for Codex)."""
from __future__ import annotations

import json

from runner.harnesses.base import Attempt, Harness
from runner.harnesses.installed import NODE, Pin

PROVIDER = "rlproxy"
OFFLINE = {"OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1",
           "OPENCODE_DISABLE_LSP_DOWNLOAD": "1", "OPENCODE_DISABLE_SHARE": "1", "OPENCODE_PURE": "1",
           "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1"}
CONTAINED = {"OPENCODE_DISABLE_PROJECT_CONFIG": "1", "OPENCODE_DISABLE_CLAUDE_CODE": "1",
             "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1"}
PLUGIN = "@opencode-ai/plugin"  # what it would install into each configuration folder


class OpenCode(Harness):
    name = "opencode"
    pin = Pin("opencode", "opencode-ai", "1.18.33", NODE)

    def command(self, attempt: Attempt) -> tuple[list[str], dict[str, str]]:
        config, home = attempt.config, attempt.home
        model = f"{PROVIDER}/{config.model}"
        folder = home / ".config" / "opencode"  # its global configuration folder ($XDG_CONFIG_HOME/opencode)
        (folder / "node_modules").mkdir(parents=True)
        dependencies = {"dependencies": {PLUGIN: self.pin.version}}
        (folder / "package.json").write_text(json.dumps(dependencies))
        lock = {"lockfileVersion": 3, "packages": {"": dependencies}}
        (folder / "package-lock.json").write_text(json.dumps(lock))
        (folder / "opencode.json").write_text(json.dumps({
            "provider": {PROVIDER: {"npm": "@ai-sdk/openai-compatible", "name": PROVIDER,
                                    "options": {"baseURL": config.openai_base_url,
                                                "apiKey": "{env:OPENAI_API_KEY}"},
                                    "models": {config.model: {"name": config.model}}}},
            "model": model, "small_model": model,  # its side calls (the session's title) to the rollout too
            "autoupdate": False, "share": "disabled"}))
        env = {"OPENAI_API_KEY": config.api_key, "PWD": str(attempt.work),
               "XDG_DATA_HOME": str(home / ".local" / "share"), "XDG_CACHE_HOME": str(home / ".cache"),
               "XDG_STATE_HOME": str(home / ".local" / "state"), **OFFLINE, **CONTAINED}
        return [attempt.program, "run", "--model", model, "--auto", *attempt.extra_args], env
