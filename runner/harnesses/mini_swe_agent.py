"""mini-swe-agent (PyPI `mini-swe-agent`): Chat Completions through litellm, its bash tool as a function call
(2.x; the text-based configuration parses a bash block instead). The rollout is litellm's `openai/NAME` model
with `model_kwargs.api_base`, in a configuration file of the attempt's home.

The prompt: `mini` takes its task as `-t TEXT` (an option: refused here) or typed at a prompt-toolkit prompt
(no pipe), or as `run.task` of any configuration file `-c` names, which is what is used: the prompt goes into
a file of its own, `-c ../home/mini-task.yaml`. Paths are given relative to the working folder because a `-c`
value holding `=` is read as a `key=value` setting, and the built-in `mini.yaml` by its absolute path because
a bare `-c mini.yaml` is looked for in the working folder first (a task's repository is data).

Offline: `MSWEA_CONFIGURED` skips the first-run wizard; litellm's cost map is its bundled copy
(`LITELLM_LOCAL_MODEL_COST_MAP`, `LITELLM_OFFLINE_MODE`), and `cost_tracking: ignore_errors`, since a model
missing from that map otherwise fails the run after its first call."""
from __future__ import annotations

import json
import re
from pathlib import Path

from runner.harnesses.base import FILE, Attempt, Harness
from runner.harnesses.installed import PYTHON, Pin

PROMPT_FILE = "mini-task.yaml"
# What PyYAML refuses or changes unescaped in a double-quoted scalar, which json.dumps(ensure_ascii=False)
# leaves raw (it escapes only the C0 controls): DEL and the C1 controls, the line breaks YAML folds (NEL,
# U+2028/9), the byte-order mark and the non-characters U+FFFE/U+FFFF.
YAML_UNPRINTABLE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff]")


def yaml_document(value: dict) -> str:
    """`value` as YAML: JSON, which YAML reads, with what PyYAML cannot take raw escaped."""
    text = json.dumps(value, ensure_ascii=False)
    return YAML_UNPRINTABLE.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


def builtin_config(program: str) -> Path:
    """The `mini.yaml` of the virtualenv `program` sits in (its default agent templates)."""
    venv = Path(program).absolute().parent.parent
    found = sorted(venv.glob("lib/python*/site-packages/minisweagent/config/mini.yaml"))
    return found[0] if found else Path(program).parent / "mini.yaml"


class MiniSweAgent(Harness):
    name = "mini-swe-agent"
    pin = Pin("mini", "mini-swe-agent", "2.4.6", PYTHON, venv="mini-swe-agent")
    prompt = FILE
    prompt_name = PROMPT_FILE

    def prompt_file_text(self, prompt: str) -> str:
        return yaml_document({"run": {"task": prompt}})

    def command(self, attempt: Attempt) -> tuple[list[str], dict[str, str]]:
        config, home = attempt.config, attempt.home
        settings = home / "rlproxy-mini.yaml"
        settings.write_text(yaml_document({"model": {
            "model_name": f"openai/{config.model}", "cost_tracking": "ignore_errors",
            "model_kwargs": {"api_base": config.openai_base_url, "drop_params": True}}}))
        env = {"OPENAI_API_KEY": config.api_key, "MSWEA_CONFIGURED": "true",
               "MSWEA_COST_TRACKING": "ignore_errors", "MSWEA_SILENT_STARTUP": "1",
               "MSWEA_GLOBAL_CONFIG_DIR": str(home / ".config" / "mini-swe-agent"),
               "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_OFFLINE_MODE": "true",
               "LITELLM_MODE": "PRODUCTION", "PAGER": "cat"}
        relative = Path("..")  # the working folder's parent holds home/
        return [attempt.program, "-c", str(builtin_config(attempt.program)),
                "-c", str(relative / "home" / settings.name), "-c", str(relative / "home" / PROMPT_FILE),
                "-y", "--exit-immediately", "-o", str(home / "trajectory.json"), *attempt.extra_args], env
