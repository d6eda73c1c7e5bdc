"""The vLLM engine supervisor (engine.local); the bundled model: tests/test_model_prepare.py.

Tests marked `engine` talk to one real vLLM engine shared by the whole run (tests/engine_fixture.py),
or to the one named by RLPROXY_TEST_ENGINE_URL.
"""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from pydantic import SecretStr

from core.settings import EngineSettings
from engine.local import (
    Engine,
    EngineError,
    engine_command,
    engine_env,
    group_members,
    vllm_available,
)
from engine.model import (
    prepare_model,
)
from tests.engine_fixture import free_port, small_engine_settings

# tests/conftest.py registers the same plugin; naming it here too keeps this file runnable alone.
pytest_plugins = ["tests.engine_fixture"]

needs_vllm = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")


# -- helpers -------------------------------------------------------------------------------------------
def http(method: str, url: str, body: dict | None = None, timeout: float = 120.0,
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def post_json(url: str, body: dict) -> dict:
    status, raw = http("POST", url, body)
    assert status == 200, raw[:2000]
    return json.loads(raw)


def sse_events(url: str, body: dict) -> list[str]:
    """The `data:` payloads of a streamed response, in order."""
    status, raw = http("POST", url, body)
    assert status == 200, raw[:2000]
    text = raw.decode()
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    events = text.split("\n\n")
    assert events[-1] == ""
    assert all(event.startswith("data: ") for event in events[:-1])
    return [event[len("data: ") :] for event in events[:-1]]


def live_members(pgid: int) -> list[tuple[int, str]]:
    return [m for m in group_members(pgid) if m[1] != "Z"]


def wait_group_gone(pgid: int, timeout: float = 10.0) -> list[tuple[int, str]]:
    deadline = time.monotonic() + timeout
    while live_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return live_members(pgid)


class ScriptEngine(Engine):
    """An Engine that runs a small Python script instead of vLLM (tests the supervision only)."""

    def __init__(self, script: str, **kwargs):
        settings = kwargs.pop("settings", None) or EngineSettings(port=free_port(), served_model_name="fake")
        super().__init__(settings, model_path=Path("/nonexistent/fake"), **kwargs)
        self.script = textwrap.dedent(script)

    def command(self) -> list[str]:
        return [sys.executable, "-c", self.script]


FAKE_SERVER = """
import json, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer
print("fake engine starting", flush=True)
time.sleep(1.0)
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"object": "list", "data": [{"id": "fake"}]}).encode()
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
HTTPServer(("127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else PORT), H).serve_forever()
"""


def fake_server(port: int) -> str:
    return FAKE_SERVER.replace("PORT", str(port))


# -- the engine command and supervision (no vLLM needed to run) ----------------------------------------
@needs_vllm
def test_engine_command_has_the_lora_and_tool_flags():
    settings = EngineSettings(port=8123, max_lora_rank=16, max_loras=3, max_model_len=2048,
                              served_model_name="policy", extra_args=("--max-num-seqs", "8"))
    cmd = engine_command(settings, Path("/models/m"), dtype="float32", seed=5)
    assert cmd[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    joined = " ".join(cmd)
    for part in ("--model /models/m", "--served-model-name policy", "--host 127.0.0.1", "--port 8123",
                 "--max-model-len 2048", "--enable-lora", "--max-lora-rank 16", "--max-loras 3",
                 "--enable-auto-tool-choice", "--tool-call-parser hermes", "--generation-config vllm", "--dtype float32", "--seed 5",
                 "--disable-uvicorn-access-log"):
        assert part in joined, part
    assert cmd[-2:] == ["--max-num-seqs", "8"]  # extra args last, so they can override
    default_name = engine_command(EngineSettings(), Path("/models/SmolLM2-135M-Instruct"))
    assert default_name[default_name.index("--served-model-name") + 1] == "SmolLM2-135M-Instruct"

    env = engine_env(EngineSettings(kv_cache_gib=3), base={"PATH": "/bin"})
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert env["HF_HUB_OFFLINE"] == "1" and env["PATH"] == "/bin"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind" and env["OMP_NUM_THREADS"] == "1"
    assert engine_env(EngineSettings(), base={"VLLM_CPU_OMP_THREADS_BIND": "1"})["VLLM_CPU_OMP_THREADS_BIND"] == "1"


def test_base_url_uses_loopback_for_wildcard_hosts():
    assert Engine(EngineSettings(port=9), model_path=Path("/m")).base_url == "http://127.0.0.1:9"
    assert Engine(EngineSettings(host="0.0.0.0", port=9), model_path=Path("/m")).base_url == "http://127.0.0.1:9"
    assert Engine(EngineSettings(host="::1", port=9), model_path=Path("/m")).base_url == "http://[::1]:9"


def test_engine_refuses_a_port_in_use():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        engine = ScriptEngine("import time; time.sleep(60)", settings=EngineSettings(port=port))
        with pytest.raises(EngineError, match="is in use"):
            engine.start()
    assert engine.pid is None


def test_engine_that_dies_reports_its_last_log_lines():
    engine = ScriptEngine("import sys; print('loading...'); print('ValueError: bad flag', flush=True); sys.exit(3)")
    with pytest.raises(EngineError, match="exited with code 3") as info:
        with engine:
            pass
    assert "ValueError: bad flag" in str(info.value) and info.value.returncode == 3
    assert not engine.running


def test_engine_wait_times_out_with_a_clear_error():
    engine = ScriptEngine("import time; print('still loading', flush=True); time.sleep(60)").start()
    try:
        with pytest.raises(EngineError, match="did not answer") as info:
            engine.wait_ready(timeout=1.5)
        assert "still loading" in str(info.value)
    finally:
        engine.stop(grace_period=2)
    assert not engine.running


def test_engine_ready_sync_and_async_and_log_forwarding(caplog):
    port = free_port()
    settings = EngineSettings(port=port, served_model_name="fake")
    with caplog.at_level("INFO", logger="engine.local.vllm"):
        with ScriptEngine(fake_server(port), settings=settings) as engine:
            status, body = http("GET", engine.base_url + "/v1/models")
            assert status == 200 and json.loads(body)["data"][0]["id"] == "fake"
            assert engine.ready_at is not None
    assert any(r.getMessage() == "[engine] fake engine starting" for r in caplog.records)
    assert not engine.running


async def test_engine_async_context_manager():
    port = free_port()
    settings = EngineSettings(port=port, served_model_name="fake")
    async with ScriptEngine(fake_server(port), settings=settings) as engine:
        status, _ = http("GET", engine.base_url + "/v1/models")
        assert status == 200
        pgid = engine.pid
    assert not engine.running and not live_members(pgid)


def test_stop_kills_the_whole_group_even_if_sigterm_is_ignored():
    script = """
        import signal, subprocess, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        subprocess.Popen(["sleep", "300"])  # a grandchild, like vLLM's engine-core process
        print("up", flush=True)
        time.sleep(300)
    """
    engine = ScriptEngine(script).start()
    deadline = time.monotonic() + 10
    while "up" not in engine.log_tail() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(live_members(engine.pid)) == 3  # the guard, its child and the grandchild
    started = time.monotonic()
    engine.stop(grace_period=1.0)
    assert time.monotonic() - started < 8
    assert not live_members(engine.pid)


def test_engine_dies_with_its_parent(tmp_path):
    """Killing the supervising process with SIGKILL still ends the engine's whole process group, even
    when the engine ignores SIGTERM and has children of its own (vLLM during its start-up)."""
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f"""
        import sys, threading, time
        sys.path.insert(0, {str(Path(__file__).parent.parent)!r})
        from tests.test_model_engine import ScriptEngine
        engine = ScriptEngine(
            "import signal, subprocess, time\\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
            "subprocess.Popen(['sleep', '300'])\\n"
            "time.sleep(300)\\n",
            grace_period=1.0,
        )
        # Started from a short-lived thread: the death signal must still wait for the process.
        worker = threading.Thread(target=engine.start)
        worker.start(); worker.join()
        time.sleep(1.0)
        print(engine.pid, flush=True)
        time.sleep(300)
    """))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              cwd=str(Path(__file__).parent.parent))
    try:
        group = int(parent.stdout.readline())
        assert len(live_members(group)) == 3, "guard, engine and its child should run while the parent lives"
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    assert not wait_group_gone(group, timeout=15), "the engine outlived its parent"


# -- the real engine -----------------------------------------------------------------------------------
@pytest.mark.engine
@needs_vllm
async def test_real_engine_starts_and_stops_without_leaving_processes():
    """A second, short-lived real engine: `async with` start, then every process of its group is gone. It has
    an engine key: without it nothing answers but its health probes, runtime LoRA loading included (any local
    process, an agent among them, could otherwise load weights under a served adapter's name)."""
    settings = small_engine_settings().model_copy(update={"engine_key": SecretStr("engine-secret")})
    async with Engine(settings, model_path=prepare_model()) as engine:
        pgid = engine.pid
        names = [open(f"/proc/{pid}/comm").read().strip() for pid, _ in live_members(pgid)]
        assert len(names) >= 2, names  # the API server and vLLM's engine-core/worker processes
        assert "engine-secret" not in " ".join(open(f"/proc/{pid}/cmdline").read() for pid, _ in live_members(pgid))
        status, body = http("GET", engine.base_url + "/v1/models", headers=engine.auth_headers)
        assert status == 200 and json.loads(body)["data"][0]["id"] == engine.served_model_name
        assert http("GET", engine.base_url + "/v1/models")[0] == 401
        load = {"lora_name": "rlproxy-v1", "lora_path": "/tmp", "load_inplace": True}
        assert http("POST", engine.base_url + "/v1/load_lora_adapter", load)[0] == 401
        # vLLM guards only /v1 and a few prefixes; its other routes load weights and generate as well
        for path, body in (("/adapters", load), ("/invocations", {"prompt": "hi", "max_tokens": 1}),
                           ("/tokenize", {"prompt": "hi"}), ("/scale_elastic_ep", {"new_data_parallel_size": 2})):
            assert http("POST", engine.base_url + path, body)[0] == 401, path
        assert http("GET", engine.base_url + "/health")[0] == 200  # probes need no key
        assert http("POST", engine.base_url + "/tokenize", {"prompt": "hi"}, headers=engine.auth_headers)[0] == 200
    assert engine.returncode is not None
    assert not live_members(pgid), live_members(pgid)


@pytest.mark.engine
def test_models_lists_the_served_name(engine_url, vllm_engine):
    status, body = http("GET", engine_url + "/v1/models")
    assert status == 200
    ids = [m["id"] for m in json.loads(body)["data"]]
    if vllm_engine is not None:
        assert vllm_engine.served_model_name in ids
        assert vllm_engine.served_model_name == "SmolLM2-135M-Instruct"
    assert ids


@pytest.mark.engine
def test_chat_returns_token_ids_and_one_logprob_per_token(engine_url, engine_model):
    messages = [{"role": "user", "content": "Name three colours."}]
    body = {"model": engine_model, "messages": messages, "max_tokens": 12, "seed": 1,
            "logprobs": True, "return_token_ids": True}
    response = post_json(engine_url + "/v1/chat/completions", body)
    choice = response["choices"][0]
    token_ids = choice["token_ids"]
    entries = choice["logprobs"]["content"]
    assert token_ids and all(isinstance(t, int) for t in token_ids)
    assert len(entries) == len(token_ids) == response["usage"]["completion_tokens"]
    assert all(isinstance(e["logprob"], float) and e["logprob"] <= 0.0 for e in entries)

    prompt_ids = response["prompt_token_ids"]
    assert len(prompt_ids) == response["usage"]["prompt_tokens"]
    tokenized = post_json(engine_url + "/tokenize", {"model": engine_model, "messages": messages})
    assert tokenized["tokens"] == prompt_ids  # /tokenize renders the same chat template

    # Without the extra fields the keys are still there, as null.
    plain = post_json(engine_url + "/v1/chat/completions", {**body, "logprobs": False, "return_token_ids": False})
    assert plain["prompt_token_ids"] is None and plain["choices"][0]["token_ids"] is None
    assert plain["choices"][0]["logprobs"] is None


@pytest.mark.engine
def test_streamed_chat_carries_the_same_ids(engine_url, engine_model):
    body = {"model": engine_model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8,
            "seed": 7, "logprobs": True, "return_token_ids": True}
    whole = post_json(engine_url + "/v1/chat/completions", body)
    events = sse_events(engine_url + "/v1/chat/completions", {**body, "stream": True})
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    first = chunks[0]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["prompt_token_ids"] == whole["prompt_token_ids"]
    ids = [t for c in chunks[1:] for t in c["choices"][0]["token_ids"]]
    logprobs = [e["logprob"] for c in chunks[1:] for e in c["choices"][0]["logprobs"]["content"]]
    assert ids == whole["choices"][0]["token_ids"]  # same seed, same tokens
    assert len(logprobs) == len(ids)
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]


def _random_lora(base: Path, out: Path, rank: int = 8) -> Path:
    """A tiny random rank-`rank` LoRA on q_proj/v_proj for `base` (no download, nonzero B)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"],
                        init_lora_weights=False, task_type="CAUSAL_LM")
    get_peft_model(model, config).save_pretrained(out)
    return out


@pytest.mark.engine
def test_lora_adapter_loads_serves_and_unloads(engine_url, engine_model, tmp_path):
    adapter = _random_lora(prepare_model(), tmp_path / "adapter")
    name = "test-lora-1"
    status, raw = http("POST", engine_url + "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(adapter)})
    assert status == 200, raw
    try:
        models = json.loads(http("GET", engine_url + "/v1/models")[1])["data"]
        entry = next(m for m in models if m["id"] == name)
        assert entry["parent"] == engine_model and entry["root"] == str(adapter)

        body = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 6, "seed": 3,
                "logprobs": True, "return_token_ids": True}
        tuned = post_json(engine_url + "/v1/chat/completions", {**body, "model": name})
        base = post_json(engine_url + "/v1/chat/completions", {**body, "model": engine_model})
        assert tuned["model"] == name
        assert len(tuned["choices"][0]["token_ids"]) == len(tuned["choices"][0]["logprobs"]["content"])
        assert tuned["prompt_token_ids"] == base["prompt_token_ids"]
        # A random adapter changes the distribution.
        assert [e["logprob"] for e in tuned["choices"][0]["logprobs"]["content"]] != [
            e["logprob"] for e in base["choices"][0]["logprobs"]["content"]
        ]
    finally:
        status, raw = http("POST", engine_url + "/v1/unload_lora_adapter", {"lora_name": name})
    assert status == 200, raw
    status, raw = http("POST", engine_url + "/v1/chat/completions",
                       {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    assert status == 404 and json.loads(raw)["error"]["type"] == "NotFoundError"


def test_the_engine_gets_the_tightest_lora_slot_vllm_accepts():
    from engine.local import lora_rank_slot

    assert [lora_rank_slot(r) for r in (1, 4, 8, 9, 16, 64)] == [1, 8, 8, 16, 16, 64]
