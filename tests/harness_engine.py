"""A scripted local engine for driving real agent harnesses (Claude Code, Codex CLI) through the proxy.

It speaks Chat Completions exactly as testkit/stub_engine.py does (same tokenizer, token ids when
`return_token_ids`, logprobs when asked, the same streaming chunks) but answers any model name, and plays the
part of a model that follows a harness's tool protocol:

  - when the offered tools include the harness's shell tool and the conversation has no tool result yet, it
    calls that tool with `SHELL_COMMAND` (or `--shell-command`), shaped as the tool's schema wants it (a string, or an argv list);
    Claude Code 2.1 offers `Bash` taking `command`, Codex 0.169 `exec_command` taking `cmd` (older Codex
    versions: `shell` with an argv list, or `shell_command`), OpenCode 1.18 `bash` and OpenClaw 2026.9 `exec`,
    both taking `command`;
  - once a tool result is in the conversation, it answers with `FINAL_TEXT`, or, where the prompt names
    mini-swe-agent's submit line (`SUBMIT`), calls the shell tool once more to print it (mini ends on that alone);
  - offered no tools but Aider's whole-file edit format (`FILE_LISTING`), it answers with a file listing that
    writes the marker file (`MARKER_LISTING`);
  - anything else (a harness's side calls: titles, summaries, topic checks) gets `SIDE_TEXT`.
Plain completions (`/v1/completions`) are answered as the stub answers them, for any model name.

Every request is appended to `--log` as one JSON line (path, model, tool names, whether a tool result was seen,
what was answered, the completion's token ids and logprobs), so a test can show what a harness sent and check
that the proxy recorded exactly what was answered.

Run it: `python tests/harness_engine.py --port 8002 --log /tmp/harness.jsonl`.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from testkit import stub_engine  # noqa: E402
from testkit.stub_answers import streamed_answer  # noqa: E402
from testkit.stub_engine import EOS_ID, Stub, dumps, error, render_chat, token_id, tokenize  # noqa: E402

MARKER = "rlproxy-marker.txt"
SHELL_COMMAND = f"echo rlproxy-ok > {MARKER}"
FINAL_TEXT = "Done. The marker file is written."
SIDE_TEXT = "Marker file"
SHELL_TOOLS = ("Bash", "bash", "exec", "shell", "shell_command", "exec_command", "local_shell", "run_shell_command")
# mini-swe-agent ends a task when a command's output starts with this line: its prompt says so
SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
# Aider's whole-file edit format, which it names in its system prompt: a file is its path, then its whole text
# fenced; the listing writes the marker file as the shell command does
FILE_LISTING = "*file listing*"
MARKER_LISTING = f"Writing the marker file.\n\n{MARKER}\n```\nrlproxy-ok\n```\n"


def _function(tool: dict) -> dict:
    return tool.get("function") or tool


def shell_tool(tools: list[dict] | None) -> dict | None:
    """The harness's shell tool among the offered chat tools: a known name taking a `command` or `cmd`."""
    for tool in tools or ():
        function = _function(tool)
        properties = (function.get("parameters") or {}).get("properties") or {}
        if function.get("name") in SHELL_TOOLS and ({"command", "cmd"} & set(properties)):
            return function
    return None


def shell_arguments(function: dict, command: str = SHELL_COMMAND) -> dict:
    properties = (function.get("parameters") or {}).get("properties") or {}
    key = "command" if "command" in properties else "cmd"
    if properties[key].get("type") == "array":  # an argv list, as Codex's `shell` takes it
        return {key: ["bash", "-lc", command]}
    return {key: command}


def prompt_sha(ids: list[int]) -> str:
    """A short fingerprint of prompt ids, so the log can name long prompts exactly."""
    return hashlib.sha256(dumps(ids)).hexdigest()[:16]


def has_tool_result(messages: list[dict]) -> bool:
    return any(m.get("role") == "tool" for m in messages)


def mentions(messages: list[dict], text: str) -> bool:
    return any(text in (m.get("content") if isinstance(m.get("content"), str) else json.dumps(m.get("content")))
               for m in messages if m.get("role") in ("system", "user"))


class HarnessEngine(Stub):
    def __init__(self, log_path: Path | None = None, shell_command: str = SHELL_COMMAND) -> None:
        super().__init__()
        self.log_path, self.shell_command = log_path, shell_command

    def known(self, model: str) -> bool:
        return bool(model)  # whatever the harness calls its model

    def _log(self, entry: dict) -> None:
        if self.log_path is not None:
            with open(self.log_path, "a") as log:
                log.write(json.dumps(entry) + "\n")

    def answer(self, body: dict) -> tuple[list[str], dict | None]:
        """The words to say and the tool call to make (or None) for this conversation."""
        messages = body.get("messages") or []
        shell = shell_tool(body.get("tools"))
        if shell is not None and has_tool_result(messages) and mentions(messages, SUBMIT):
            return self._call(messages, shell, f"echo {SUBMIT}")  # mini-swe-agent: done, and says so
        if shell is None and mentions(messages, FILE_LISTING):
            return [MARKER_LISTING], None  # one piece: the listing's line breaks are its syntax
        if shell is not None and not has_tool_result(messages):
            return self._call(messages, shell, self.shell_command)
        if has_tool_result(messages):
            return FINAL_TEXT.split(), None
        return SIDE_TEXT.split(), None

    def _call(self, messages: list[dict], shell: dict, command: str) -> tuple[list[str], dict]:
        arguments = json.dumps(shell_arguments(shell, command))
        call = {"id": f"call_{token_id(render_chat(messages)) % 10**8}", "type": "function",
                "function": {"name": shell["name"], "arguments": arguments}}
        return ["<tool_call>", json.dumps({"name": shell["name"], "arguments": arguments}), "</tool_call>"], call

    async def _complete(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        body = await self._body(request)
        if body is None:
            return error(400, "invalid JSON")
        if not chat:
            self.requests -= 1
            return await super()._complete(request, chat=False)  # the body read above is cached
        if not isinstance(body.get("messages"), list):
            return error(400, "messages: required")
        if not self.known(body.get("model", "")):
            return error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        prompt_ids = tokenize(render_chat(body["messages"]))
        words, tool_call = self.answer(body)
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or 16
        words = words[:max_tokens]
        stopped = len(words) < max_tokens
        ids = [token_id(w) for w in words] + ([EOS_ID] if stopped else [])
        finish = "tool_calls" if tool_call else ("stop" if stopped else "length")
        self._log({"path": request.path, "model": body.get("model"), "stream": bool(body.get("stream")),
                   "tools": [_function(t).get("name") for t in body.get("tools") or ()],
                   "messages": len(body["messages"]), "tool_result": has_tool_result(body["messages"]),
                   "return_token_ids": bool(body.get("return_token_ids")), "logprobs": body.get("logprobs"),
                   "answer": tool_call["function"] if tool_call else " ".join(words),
                   "prompt_sha": prompt_sha(prompt_ids), "completion_ids": ids,
                   "completion_logprobs": [self.logprob(i, body) for i in range(len(ids))]})
        choices = [(words, ids, tool_call, finish)]
        if body.get("stream"):
            return await streamed_answer(request, body, True, prompt_ids, choices, self.logprob)
        return web.Response(body=dumps(self._full(body, True, prompt_ids, choices)), content_type="application/json")


def build_app(log_path: Path | None = None, shell_command: str = SHELL_COMMAND) -> web.Application:
    return stub_engine.build_app(stub=HarnessEngine(log_path, shell_command))


if __name__ == "__main__":
    parser = stub_engine.arguments(8002)
    parser.add_argument("--log", type=Path, default=None, help="append one JSON line per request here")
    parser.add_argument("--shell-command", default=SHELL_COMMAND, help="what the shell tool call runs")
    args = parser.parse_args()
    stub_engine.serve(build_app(args.log, args.shell_command), args.host, args.port)
