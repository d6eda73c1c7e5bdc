"""The engine's key guards every route (engine/route_guard.py), not only vLLM's /v1: an engine given a key must not
load adapters (`POST /adapters`) or generate (`POST /invocations`) for a caller without it.

The real engine's routes are checked in tests/test_model_engine.py (the keyed engine); here the middleware alone,
as vLLM calls it (an ASGI app wrapping the server's).
"""
from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr

import engine.command as command
from core.settings.engine import EngineSettings
from engine.command import KEY_ON_EVERY_ROUTE, engine_command
from engine.route_guard import OPEN_PATHS, RequireEngineKey


def call(guard: RequireEngineKey, path: str, *, method: str = "POST", headers=(), kind: str = "http"):
    """One request through the guard: (what the wrapped server saw, what was sent back)."""
    reached, sent = [], []

    async def server(scope, receive, send):
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": kind, "path": path, "method": method, "headers": list(headers)}
    asyncio.run(RequireEngineKey(server, **guard)(scope, receive, send))
    return reached, sent


KEY = {"key": "engine-secret"}
WITH_KEY = [(b"authorization", b"Bearer engine-secret")]


@pytest.mark.parametrize("path", ["/adapters", "/invocations", "/tokenize", "/scale_elastic_ep", "/v1/models",
                                  "/unknown", "/health/", "/Health", "//health"])
def test_without_the_key_nothing_but_the_probes_reaches_the_engine(path):
    reached, sent = call(KEY, path)
    assert reached == []
    assert sent[0]["status"] == 401 and b"requires its API key" in sent[1]["body"]


@pytest.mark.parametrize("headers", [[(b"authorization", b"Bearer wrong")], [(b"authorization", b"engine-secret")],
                                     [(b"authorization", b"Basic engine-secret")], [(b"x-api-key", b"engine-secret")]])
def test_a_wrong_or_misplaced_key_is_refused(headers):
    assert call(KEY, "/adapters", headers=headers)[0] == []


def test_with_the_key_every_route_reaches_the_engine():
    assert call(KEY, "/adapters", headers=WITH_KEY)[0] == ["/adapters"]
    assert call(KEY, "/invocations", headers=[(b"Authorization", b"bearer engine-secret")])[0] == ["/invocations"]


@pytest.mark.parametrize("path", sorted(OPEN_PATHS))
def test_probes_and_metrics_need_no_key(path):
    assert call(KEY, path, method="GET")[0] == [path]


def test_a_websocket_without_the_key_is_closed_before_it_opens():
    reached, sent = call(KEY, "/v1/realtime", kind="websocket")
    assert reached == [] and sent == [{"type": "websocket.close", "code": 1008}]


def test_an_engine_without_a_key_is_left_as_its_operator_started_it(monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert call({}, "/adapters")[0] == ["/adapters"]
    monkeypatch.setenv("VLLM_API_KEY", "from-the-environment")  # as vLLM's process gets it from engine_env
    assert call({}, "/adapters")[0] == []
    assert call({}, "/adapters", headers=[(b"authorization", b"Bearer from-the-environment")])[0] == ["/adapters"]


def test_a_keyed_engine_is_started_with_the_guard(monkeypatch):
    monkeypatch.setattr(command, "vllm_available", lambda: True)
    keyed = engine_command(EngineSettings(engine_key=SecretStr("k")), Path("/m"))
    assert keyed[keyed.index("--middleware") + 1] == KEY_ON_EVERY_ROUTE
    assert "--middleware" not in engine_command(EngineSettings(), Path("/m"))


def test_the_guard_loads_alone_with_the_standard_library_only(tmp_path):
    """vLLM loads engine/route_guard.py by its module name and the Helm chart mounts the file alone into vLLM's
    image: it may import nothing of the project and nothing outside the standard library. Loaded here as that
    image has it, the one file in an empty folder, by a Python that sees neither the project nor site-packages
    (-I -S)."""
    source = Path(__file__).resolve().parents[1] / "engine" / "route_guard.py"
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "route_guard.py").write_bytes(source.read_bytes())
    code = ("import sys; sys.path.insert(0, '.'); import engine.route_guard as guard; "
            "print(guard.RequireEngineKey.__name__, sorted({m.split('.')[0] for m in sys.modules} - "
            "set(sys.stdlib_module_names) - {'engine', '__main__'}))")
    loaded = subprocess.run([sys.executable, "-I", "-S", "-c", code], cwd=tmp_path, capture_output=True, text=True,
                            timeout=60)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split() == ["RequireEngineKey", "[]"], loaded.stdout
