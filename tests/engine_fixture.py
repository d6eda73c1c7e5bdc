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


@pytest.fixture(scope="session")
def vllm_engine():
    """The shared `engine.local.Engine` (None when `RLPROXY_TEST_ENGINE_URL` names an external one)."""
    if os.environ.get(ENGINE_URL_ENV):
        yield None
        return
    from engine.local import Engine, vllm_available
    from engine.model import prepare_model

    if not vllm_available():
        pytest.skip("vLLM is not installed (pip install -e '.[engine]')")
    engine = Engine(small_engine_settings(), model_path=prepare_model())
    engine.start()
    try:
        engine.wait_ready()
    except BaseException:
        engine.stop()
        raise
    yield engine
    pgid = engine.pid
    engine.stop()
    from engine.local import group_members

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
    url = request.getfixturevalue("engine_url")
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=10) as response:
            models = json.loads(response.read())["data"]
    except OSError:
        return  # the engine is down: the test that brought it down says so
    for model in models:
        if model.get("parent") not in (None, model["id"]):
            body = json.dumps({"lora_name": model["id"]}).encode()
            unload = urllib.request.Request(url + "/v1/unload_lora_adapter", data=body, method="POST",
                                            headers={"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(unload, timeout=30).close()
            except OSError:
                pass
