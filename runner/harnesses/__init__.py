"""The harnesses `rlproxy run --harness NAME` drives, by name: `HARNESSES` is where `--harness`'s choices come
from. Each is a module here (its command line, configuration files, offline switches and pinned version) over
runner/harnesses/base.py (the fresh folders, the environment, the verifier). Add one: a module with a
`Harness` subclass, a line below, its install in scripts/install.sh and its row in docs/run.md."""
from __future__ import annotations

from runner.harnesses.aider import Aider
from runner.harnesses.base import Harness, HarnessAgent
from runner.harnesses.claude_code import ClaudeCode
from runner.harnesses.codex import Codex
from runner.harnesses.gemini_cli import GeminiCli
from runner.harnesses.mini_swe_agent import MiniSweAgent
from runner.harnesses.openclaw import OpenClaw
from runner.harnesses.opencode import OpenCode
from runner.harnesses.qwen_code import QwenCode

HARNESSES: dict[str, Harness] = {harness.name: harness for harness in (
    ClaudeCode(),
    Codex(),
    MiniSweAgent(),
    Aider(),
    OpenCode(),
    OpenClaw(),
    QwenCode(),
    GeminiCli(),
)}

__all__ = ["HARNESSES", "Harness", "HarnessAgent"]
