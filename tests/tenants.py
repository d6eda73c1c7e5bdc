"""Two tenants on one proxy: `rlproxy serve` with keys on in front of the stand-in engine, which runs in the test
process so that what it received can be read back (`Stub.received`: every request's method and raw path).

Projects `alpha` and `beta` each have a policy of their own (`--policy-rule project:alpha=alpha` …) with an active
adapter loaded on the engine: alpha's version 1, beta's version 2, each under the name its row keeps
(`Tenants.adapters`, as `GET /policies` shows it: `rlproxy-v1-<random>`, `rlproxy-v2-<random>`). `gamma` has
no rule, so it gets the default policy, which has no version: the base model. `alpha-admin` and `beta-admin`
are admin keys of those projects; `operator` is the admin key of no project."""
from __future__ import annotations

import asyncio
import http.client
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import anthropic
import openai
import requests
from aiohttp import web

from testkit.stub_engine import BASE_MODEL, Stub, build_app
from tests.support import add_policies, fresh_database, make_key, running_proxy

OPERATOR = "operator-" + uuid.uuid4().hex
MAX_BODY = 64 * 1024
PROJECTS = ("alpha", "beta")  # each with a policy of its own, whose version 1 or 2 serves
# A body each relayed engine route takes (proxy/edge/engine_routes.py FIELDS), naming no model.
RELAYED_BODIES = {
    "/tokenize": {"prompt": "one two"}, "/detokenize": {"tokens": [1, 2]}, "/v1/embeddings": {"input": "one two"},
    "/v2/embed": {"texts": ["one two"]}, "/pooling": {"input": "one two"}, "/classify": {"input": "one two"},
    "/score": {"text_1": "one", "text_2": "two"}, "/v1/score": {"text_1": "one", "text_2": "two"},
    "/rerank": {"query": "one", "documents": ["two"]}, "/v1/rerank": {"query": "one", "documents": ["two"]},
    "/v2/rerank": {"query": "one", "documents": ["two"]},
}


@dataclass
class Tenants:
    url: str
    stub: Stub
    stub_url: str
    keys: dict[str, str]  # project (or "alpha-admin", "beta-admin", "alpha-eval", "operator") -> key
    adapters: dict[str, str]  # project -> its active version's adapter name

    def headers(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[who]}"}

    def openai(self, who: str, base_url: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(base_url=base_url or f"{self.url}/v1", api_key=self.keys[who], max_retries=0)

    def anthropic(self, who: str, base_url: str | None = None) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=base_url or self.url, api_key=self.keys[who], max_retries=0)

    def rollout(self, who: str) -> dict:
        created = requests.post(f"{self.url}/rollouts", json={}, headers=self.headers(who))
        assert created.status_code == 201, created.text
        return created.json()

    def calls(self, who: str, rollout_id: str) -> list[dict]:
        return requests.get(f"{self.url}/rollouts/{rollout_id}", headers=self.headers(who)).json()["calls"]


@contextmanager
def engine_in_thread(stub: Stub) -> Iterator[str]:
    """The stand-in engine's HTTP server on its own event loop in a thread; yields its URL."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(build_app(stub=stub, pooling=False), access_log=None)  # a generative model's engine
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, name="stub-engine", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@contextmanager
def secured_tenants(postgres_server: str, run_dir: Path, adapters: Path) -> Iterator[Tenants]:
    stub = Stub(BASE_MODEL)
    with engine_in_thread(stub) as engine_url, fresh_database(postgres_server) as database_url:
        names = {}
        for version, project in enumerate(PROJECTS, start=1):
            names[project] = asyncio.run(add_policies(database_url, adapters, [version], active=version,
                                                      engine_url=engine_url, policy=project))[version]
        keys = {project: make_key(database_url, project) for project in ("alpha", "beta", "gamma")}
        keys |= {f"{project}-admin": make_key(database_url, project, admin=True) for project in PROJECTS}
        keys["alpha-eval"] = make_key(database_url, "alpha", eval=True)  # made for evaluation (keys create --eval)
        rules = [arg for project in PROJECTS for arg in ("--policy-rule", f"project:{project}={project}")]
        with running_proxy([engine_url], database_url, run_dir, "proxy-tenants",
                           "--client-max-size", str(MAX_BODY), *rules, env={"RLPROXY_ADMIN_KEY": OPERATOR}) as url:
            yield Tenants(url, stub, engine_url, {**keys, "operator": OPERATOR}, names)


# What the engine receives besides the tests' requests: the proxy's own health checks, at any moment.
PROBE = ("GET", "/v1/models")


def send(url: str, method: str, target: str, key: str | None, body: bytes = b'{"prompt": "one two"}'):
    """One request with its target sent byte for byte (http.client, unlike requests, resolves nothing)."""
    where = urlsplit(url)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    try:
        body = None if method in ("GET", "OPTIONS") else body
        connection.request(method, target, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def received(tenants) -> list[tuple[str, str]]:
    """(method, raw target) of what reached the engine, the proxy's own health checks left out."""
    return [seen for seen in tenants.stub.received if seen != PROBE]
