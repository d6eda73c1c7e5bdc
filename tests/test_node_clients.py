"""Real Node clients, unmodified, pointed at the proxy only by a base URL or environment variables:

  - the Vercel AI SDK (`ai` 6 with `@ai-sdk/openai`'s default provider, which speaks the Responses API):
    `generateText` and `streamText` with a tool the SDK runs itself between steps — against the stub engine;
  - Claude Code (`claude -p`, the Anthropic Messages API) and the Codex CLI (`codex exec`, the Responses API),
    each running a shell command in a temporary folder — against tests/harness_engine.py, a scripted engine that
    follows their tool protocols (a 135M model cannot drive them).

Each checks that the client did its job, that every engine call it caused was recorded with exact prompt and
completion token ids and one logprob per completion token, and — from the bytes the client really received,
through a recording TCP relay — that nothing the proxy asks the engine for (token ids, logprobs) reached it.

The clients are npm packages that scripts/install.sh puts in `.venv/node` (where npm exists); without node
these tests are skipped.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests

from testkit.stub_engine import EOS_ID, render_chat, tokenize
from tests.harness_engine import FINAL_TEXT, MARKER, SHELL_COMMAND, prompt_sha
from tests.support import PYTHON, ROOT, free_port, pump, running, running_proxy

NODE_DIR = Path(sys.prefix) / "node"  # scripts/install.sh: $VENV/node
NODE_MODULES = NODE_DIR / "node_modules"
CLAUDE = NODE_MODULES / ".bin" / "claude"
CODEX = NODE_MODULES / ".bin" / "codex"
AI_SDK_AGENT = ROOT / "tests" / "node" / "ai_sdk_agent.cjs"
CLIENT_TIMEOUT = 90  # seconds for one client run; each takes a few
PROMPT = "please use tool to compute 6*7"  # the stub engine calls the first tool offered on "use tool"

pytestmark = pytest.mark.skipif(not (shutil.which("node") and shutil.which("npm")),
                                reason="node and npm are not installed: the Node client tests need Node 20+ "
                                       "(scripts/install.sh then installs the clients into .venv/node)")


def require(*paths: Path) -> None:
    """Node is here, so the clients should be too: fail (not skip) saying how to get them."""
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        pytest.fail(f"Node client missing: {', '.join(missing)}; run `make install` (scripts/install.sh "
                    f"npm-installs the clients into {NODE_DIR})", pytrace=False)


# -- helpers -----------------------------------------------------------------------------------------------------
def new_rollout(proxy_url: str) -> tuple[str, str]:
    response = requests.post(f"{proxy_url}/rollouts", json={"task_id": "node-clients"})
    assert response.status_code == 201, response.text
    return response.json()["rollout_id"], response.json()["base_url"]


def recorded_calls(proxy_url: str, rollout_id: str) -> list[dict]:
    response = requests.get(f"{proxy_url}/rollouts/{rollout_id}")
    assert response.status_code == 200, response.text
    return response.json()["calls"]


def client_env(home: Path, **extra: str) -> dict[str, str]:
    """The test's environment without anything that could point a client elsewhere, and a home of its own."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OPENAI_", "ANTHROPIC_", "CLAUDE_", "CODEX_", "AI_SDK_", "NODE_"))}
    home.mkdir(parents=True, exist_ok=True)
    return {**env, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "NO_COLOR": "1", **extra}


def run_client(args: list[str], *, env: dict[str, str], cwd: Path, logs: tuple[Path, ...] = ()) -> str:
    """Run a client to its end (its whole process group killed after CLIENT_TIMEOUT); return its stdout, or fail
    showing its output and the tails of `logs`."""
    process = subprocess.Popen([str(a) for a in args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=CLIENT_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"{args[0]} did not finish in {CLIENT_TIMEOUT}s\n{report(stdout, stderr, logs)}")
    if process.returncode != 0:
        pytest.fail(f"{args[0]} exited with {process.returncode}\n{report(stdout, stderr, logs)}")
    return stdout


def report(stdout: str, stderr: str, logs: tuple[Path, ...]) -> str:
    parts = [f"--- stdout\n{stdout[-4000:]}", f"--- stderr\n{stderr[-4000:]}"]
    parts += [f"--- {path.name}\n{path.read_text()[-4000:]}" for path in logs if path.exists()]
    return "\n".join(parts)


@contextmanager
def recording_relay(target: str):
    """A TCP relay in front of `target` (http://host:port) keeping every byte it passes back to the client: what
    the client really received. Yields the relay's URL and a function returning those bytes (one connection's
    bytes after another's)."""
    upstream = urlsplit(target)
    received: list[bytearray] = []
    loop = asyncio.new_event_loop()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(upstream.hostname, upstream.port)
        seen = bytearray()
        received.append(seen)
        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer, seen.extend))

    server = loop.run_until_complete(asyncio.start_server(relay, "127.0.0.1", 0))
    thread = threading.Thread(target=loop.run_forever, name="relay", daemon=True)
    thread.start()

    async def shutdown() -> None:
        server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", lambda: b"\n".join(bytes(b) for b in received)
    finally:
        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def assert_nothing_added(received: bytes, *, responses_api: bool) -> None:
    """No token ids anywhere; logprobs only as the Responses API's own empty `logprobs` lists (the agent asked for
    none), and not at all in Anthropic's format, which has no such field."""
    assert b"token_ids" not in received
    logprobs = re.findall(rb'"logprobs"\s*:\s*(\[\]|.)', received)
    if responses_api:
        assert set(logprobs) <= {b"[]"}, set(logprobs)
    else:
        assert logprobs == []


def assert_exact(call: dict, engine_log: list[dict]) -> None:
    """The call was recorded whole: ok, with the prompt ids the engine computed, the completion ids it produced and
    one logprob per completion token (the stub's values)."""
    assert call["status"] == "ok" and call["http_status"] == 200 and call["error"] is None
    engine = [e for e in engine_log if e["prompt_sha"] == prompt_sha(call["prompt_token_ids"])]
    assert engine, f"call {call['seq']}: no engine request had these prompt ids"
    assert call["prompt_token_ids"] and call["completion_token_ids"] == engine[-1]["completion_ids"]
    assert call["completion_logprobs"] == pytest.approx([-0.05 * (1 + i % 7)
                                                         for i in range(len(call["completion_token_ids"]))])


# -- the Vercel AI SDK -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["generate", "stream"])
def test_vercel_ai_sdk_runs_a_tool_between_steps_and_every_step_is_recorded(proxy_url, tmp_path, mode):
    require(NODE_MODULES / "ai", NODE_MODULES / "@ai-sdk" / "openai", NODE_MODULES / "zod")
    rollout_id, base_url = new_rollout(proxy_url)
    with recording_relay(proxy_url) as (relay_url, received):
        env = client_env(tmp_path / "home", OPENAI_BASE_URL=base_url.replace(proxy_url, relay_url),
                         OPENAI_API_KEY="sk-unused", NODE_PATH=str(NODE_MODULES))
        out = json.loads(run_client(["node", AI_SDK_AGENT, mode, "--tool", PROMPT], env=env, cwd=tmp_path))
        seen = received()

    # The SDK called the tool with the model's arguments, sent the result back, and finished with text.
    assert out["executed"] == ["6*7"]
    first, second = out["steps"]
    [tool_call] = first["toolCalls"]
    assert tool_call["toolName"] == "calculate" and tool_call["input"] == {"expression": "6*7"}
    assert first["toolResults"] == [{"toolCallId": tool_call["toolCallId"], "toolName": "calculate", "output": "42"}]
    assert first["finishReason"] == "tool-calls" and second["finishReason"] == out["finishReason"] == "stop"
    assert second["text"] == out["text"] != "" and second["modelId"] == "stub-model"
    if mode == "stream":
        assert len(out["deltas"]) > 1 and "".join(out["deltas"]) == out["text"]

    calls = recorded_calls(proxy_url, rollout_id)
    assert [(c["seq"], c["route"], c["stream"]) for c in calls] == [(1, "responses", mode == "stream"),
                                                                    (2, "responses", mode == "stream")]
    assert [f"resp_{c['call_id']}" for c in calls] == [first["responseId"], second["responseId"]]
    assert calls[0]["prompt_token_ids"] == tokenize(render_chat([{"role": "user", "content": PROMPT}]))
    assert calls[0]["finish_reason"] == "tool_calls"
    assert calls[0]["response"]["output"][-1]["call_id"] == tool_call["toolCallId"]
    assert calls[1]["request"]["input"][-1] == {"type": "function_call_output", "call_id": tool_call["toolCallId"],
                                                "output": "42"}
    assert calls[1]["completion_token_ids"] == tokenize(out["text"]) + [EOS_ID]
    for call in calls:
        assert call["status"] == "ok" and call["prompt_token_ids"]
        assert len(call["completion_logprobs"]) == len(call["completion_token_ids"]) > 0
    # The usage the SDK added up is the recorded token counts.
    assert out["usage"]["inputTokens"] == sum(len(c["prompt_token_ids"]) for c in calls)
    assert out["usage"]["outputTokens"] == sum(len(c["completion_token_ids"]) for c in calls)

    assert (b"response.completed" if mode == "stream" else b'"status":"completed"') in seen
    assert_nothing_added(seen, responses_api=True)


# -- agent harnesses against the scripted engine -------------------------------------------------------------------
@pytest.fixture(scope="module")
def harness(database_url, run_dir):
    """tests/harness_engine.py and a proxy in front of it; yields (proxy URL, engine log path, proxy log path)."""
    port = free_port()
    engine_url = f"http://127.0.0.1:{port}"
    engine_log = run_dir / "harness-requests.jsonl"
    args = [PYTHON, str(ROOT / "tests" / "harness_engine.py"), "--port", str(port), "--log", str(engine_log)]
    with running(args, engine_url + "/health", log_path=run_dir / "harness-engine.log"):
        with running_proxy([engine_url], database_url, run_dir, "harness-proxy") as proxy_url:
            yield proxy_url, engine_log, run_dir / "harness-proxy.log"


def engine_requests(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_claude_code_runs_a_shell_command_and_every_call_is_recorded(harness, tmp_path):
    require(CLAUDE)
    proxy_url, engine_log, proxy_log = harness
    rollout_id, base_url = new_rollout(proxy_url)
    workdir = tmp_path / "work"
    workdir.mkdir()
    before = len(engine_requests(engine_log))
    with recording_relay(proxy_url) as (relay_url, received):
        # The Anthropic client appends /v1/messages itself: the base URL is the rollout's, without /v1.
        env = client_env(tmp_path / "home", ANTHROPIC_BASE_URL=base_url.replace(proxy_url, relay_url)[: -len("/v1")],
                         ANTHROPIC_API_KEY="sk-ant-unused", CLAUDE_CONFIG_DIR=str(tmp_path / "home" / ".claude"),
                         DISABLE_TELEMETRY="1", DISABLE_ERROR_REPORTING="1", DISABLE_AUTOUPDATER="1",
                         CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1")
        stdout = run_client([CLAUDE, "-p", "Write the marker file.", "--allowedTools", "Bash", "--max-turns", "4",
                             "--output-format", "json"], env=env, cwd=workdir, logs=(engine_log, proxy_log))
        seen = received()

    result = json.loads(stdout)
    assert result["is_error"] is False and result["result"] == FINAL_TEXT, result
    assert (workdir / MARKER).read_text() == "rlproxy-ok\n"  # the tool call really ran, in the working folder

    log = engine_requests(engine_log)[before:]
    calls = recorded_calls(proxy_url, rollout_id)
    assert len(calls) == len(log) >= 2  # every engine call Claude Code caused is in the rollout
    assert {c["route"] for c in calls} == {"messages"}
    for call in calls:
        assert_exact(call, log)
    [tool_use] = [b for b in calls[0]["response"]["content"] if b["type"] == "tool_use"]
    assert tool_use["name"] == "Bash" and tool_use["input"] == {"command": SHELL_COMMAND}
    assert calls[0]["finish_reason"] == "tool_calls"
    last = calls[-1]
    results = [b for m in last["request"]["messages"] if isinstance(m["content"], list)
               for b in m["content"] if b.get("type") == "tool_result"]
    assert [r["tool_use_id"] for r in results] == [tool_use["id"]]
    assert last["response"]["content"] == [{"type": "text", "text": FINAL_TEXT}]
    assert last["completion_token_ids"] == tokenize(FINAL_TEXT) + [EOS_ID]

    assert b"event: message_stop" in seen
    assert_nothing_added(seen, responses_api=False)


def test_codex_cli_runs_a_shell_command_and_every_call_is_recorded(harness, tmp_path):
    require(CODEX)
    proxy_url, engine_log, proxy_log = harness
    rollout_id, base_url = new_rollout(proxy_url)
    workdir, codex_home = tmp_path / "work", tmp_path / "codex-home"
    workdir.mkdir()
    codex_home.mkdir()
    before = len(engine_requests(engine_log))
    with recording_relay(proxy_url) as (relay_url, received):
        (codex_home / "config.toml").write_text(f'''
model = "harness-model"
model_provider = "rlproxy"

[model_providers.rlproxy]
name = "rlproxy"
base_url = "{base_url.replace(proxy_url, relay_url)}"
wire_api = "responses"
env_key = "RLPROXY_API_KEY"
''')
        env = client_env(tmp_path / "home", CODEX_HOME=str(codex_home), RLPROXY_API_KEY="sk-unused")
        # No sandbox of Codex's own (it needs user namespaces many CI containers lack): the temporary folder and
        # the scripted engine's one `echo` are the sandbox.
        stdout = run_client([CODEX, "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
                             "--json", "-C", workdir, "Write the marker file."],
                            env=env, cwd=workdir, logs=(engine_log, proxy_log))
        seen = received()

    events = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    items = [e["item"] for e in events if e.get("type") == "item.completed"]
    assert [i["text"] for i in items if i.get("type") == "agent_message"] == [FINAL_TEXT], stdout
    [command] = [i for i in items if i.get("type") == "command_execution"]
    assert SHELL_COMMAND in command["command"] and command["exit_code"] == 0, command
    assert (workdir / MARKER).read_text() == "rlproxy-ok\n"

    log = engine_requests(engine_log)[before:]
    calls = recorded_calls(proxy_url, rollout_id)
    assert len(calls) == len(log) >= 2
    assert {c["route"] for c in calls} == {"responses"}
    for call in calls:
        assert_exact(call, log)
    [function_call] = [i for i in calls[0]["response"]["output"] if i["type"] == "function_call"]
    assert function_call["name"] == "exec_command"
    assert json.loads(function_call["arguments"]) == {"cmd": SHELL_COMMAND}
    last = calls[-1]
    outputs = [i for i in last["request"]["input"] if i.get("type") == "function_call_output"]
    assert [o["call_id"] for o in outputs] == [function_call["call_id"]]
    assert [i["content"][0]["text"] for i in last["response"]["output"] if i["type"] == "message"] == [FINAL_TEXT]
    assert last["completion_token_ids"] == tokenize(FINAL_TEXT) + [EOS_ID]

    assert b"event: response.completed" in seen
    assert_nothing_added(seen, responses_api=True)
