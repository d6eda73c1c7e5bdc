"""Shared fixtures: a real Postgres database, the stub engine and the proxy as real processes.

Postgres: `RLPROXY_TEST_POSTGRES` (a server URL; `start` for a server of the run's own), else the server on
127.0.0.1:5432 if one answers, else one started for this test run (tests/postgres.py) from the machine's
PostgreSQL server binaries or those scripts/install.sh installed where it had none.
"""
from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest

from migrations.apply import upgrade
from store.db import open_database, session_factory
from tests.postgres import server_binaries, temporary_server
from tests.support import PYTHON, ROOT, free_port, fresh_database, running, running_proxy, stub_command

pytest_plugins = ["tests.budget"]
if (Path(__file__).parent / "engine_fixture.py").exists():
    pytest_plugins.append("tests.engine_fixture")

LOCAL_SERVER = "postgresql://postgres@127.0.0.1:5432/test"
# `rlproxy run`'s agents in the other tests write what they saw next to their journal in tmp_path, which a
# confined agent may not (runner/confine.py); tests/test_run_confined.py runs them confined. Set it to 1 to run
# every test's agents confined.
os.environ.setdefault("RLPROXY_CONFINE_AGENTS", "0")


def _answers(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=2):
            return True
    except psycopg.Error:
        return False


@pytest.fixture(scope="session")
def postgres_server() -> str:
    """A libpq URL of a Postgres server we may create databases on."""
    url = os.environ.get("RLPROXY_TEST_POSTGRES", "")
    if url and url != "start":
        yield url
        return
    if not url and _answers(LOCAL_SERVER):
        yield LOCAL_SERVER
        return
    binaries = server_binaries()
    if binaries is None:
        pytest.exit("No Postgres for the tests and no server binaries to start one: run `make install` (it installs "
                    "them), set RLPROXY_TEST_POSTGRES, or run a server on 127.0.0.1:5432.", 2)
    with temporary_server(binaries) as url:
        yield url


@pytest.fixture(scope="session")
def database_url(postgres_server: str) -> str:
    """A fresh, migrated Postgres database shared by this test run (asyncpg URL)."""
    with fresh_database(postgres_server) as url:
        yield url


@pytest.fixture
def own_database_url(postgres_server: str) -> str:
    """A fresh, migrated Postgres database for one test alone."""
    with fresh_database(postgres_server) as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite+aiosqlite:///{tmp_path / 'rlproxy.db'}"
    upgrade(url)
    return url


@pytest.fixture(params=["postgres", "sqlite"])
async def sessions(request):
    """Sessions on the run's shared Postgres database, then on a fresh SQLite one: store code on both."""
    url = request.getfixturevalue("database_url" if request.param == "postgres" else "sqlite_url")
    database = open_database(url)
    yield session_factory(database)
    await database.dispose()


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("run")


@pytest.fixture(scope="session")
def stub_url(run_dir: Path) -> str:
    """The vLLM-like stub engine, a real process."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with running(stub_command(port), url + "/health", log_path=run_dir / "stub.log"):
        yield url


@pytest.fixture(scope="session")
def proxy_url(stub_url: str, database_url: str, run_dir: Path) -> str:
    """`rlproxy serve` in front of the stub, recording into the test Postgres database."""
    with running_proxy([stub_url], database_url, run_dir) as url:
        yield url


@pytest.fixture(scope="session")
def tenants(postgres_server: str, run_dir: Path, tmp_path_factory):
    """Projects alpha and beta, each with its own adapter, on one secured proxy (tests/tenants.py)."""
    from tests.tenants import secured_tenants

    with secured_tenants(postgres_server, run_dir, tmp_path_factory.mktemp("tenant-adapters")) as tenants:
        yield tenants


TINY_VOCAB = 512


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny random Llama saved as a Hugging Face folder (no downloads), for fast trainer tests."""
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def family_model():
    """`family_model("qwen3")`: the folder of that family's tiny random model with its real vocabulary
    (testkit/model_kit), built once per machine and cached (RLPROXY_MODEL_KIT_CACHE)."""
    pytest.importorskip("transformers")
    from testkit.model_kit import build_model

    return build_model


@pytest.fixture(scope="module")
def harness_stand_in(database_url: str, run_dir: Path, request):
    """The scripted engine stand-in (tests/harness_engine.py) and a proxy in front of it, one pair per test module
    of real harnesses: (the proxy's URL, the stand-in's request log)."""
    name = request.module.__name__.rsplit(".", 1)[-1]
    port, log = free_port(), run_dir / f"{name}-engine-requests.jsonl"
    args = [PYTHON, str(ROOT / "tests" / "harness_engine.py"), "--port", str(port), "--log", str(log)]
    with running(args, f"http://127.0.0.1:{port}/health", log_path=run_dir / f"{name}-engine.log"):
        with running_proxy([f"http://127.0.0.1:{port}"], database_url, run_dir, f"{name}-proxy") as url:
            yield url, log
