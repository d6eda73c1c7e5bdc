"""`GET /openapi.json` describes the proxy as it runs, and the running proxy keeps to it: schemathesis sends
generated requests (valid and invalid) to every documented operation of a real `rlproxy serve` (auth on,
limits set, stub engine, Postgres) and checks that nothing answers 5xx and every answer matches the
document (status, content type, headers, body schema)."""
from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from proxy.openapi import openapi_document
from rlproxy.settings import AuthSettings, ProxySettings
from store.db import create_engine, session_factory
from store.keys import create_key
from tests.support import fresh_database, running_proxy

ADMIN_KEY = "openapi-test-admin-key"
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]
# The document this server configuration serves, built here so the cases can be generated at collection time
# (the first test checks that the running server serves exactly this).
SETTINGS = ProxySettings(auth=AuthSettings(admin_key=ADMIN_KEY, max_tokens=64, max_n=4))
DOCUMENT = openapi_document(SETTINGS, auth_enabled=True, served_model="stub-model")


def _single_prompts(document: dict) -> dict:
    """The document to generate from: batch prompts left out, because the stub engine answers them unlike
    vLLM (one nested id list for the whole batch instead of a flat list per prompt)."""
    document = copy.deepcopy(document)
    prompt = document["paths"]["/v1/completions"]["post"]["requestBody"]["content"]["application/json"][
        "schema"]["properties"]["prompt"]
    prompt["anyOf"] = [v for v in prompt["anyOf"] if v.get("items", {}).get("type") != "array"
                       and v.get("items", {}).get("type") != "string"]
    return document


@schemathesis.serializer("application/x-protobuf")
def _protobuf_bytes(ctx, value) -> bytes:
    """/v1/traces also reads binary protobuf (OTLP): generated binary strings are sent as they are."""
    return value if isinstance(value, bytes) else str(value).encode()


schema = schemathesis.openapi.from_dict(_single_prompts(DOCUMENT))


@dataclass(frozen=True)
class Api:
    url: str
    agent_key: str


def make_key(database_url: str, project: str) -> str:
    async def go() -> str:
        engine = create_engine(database_url)
        try:
            async with session_factory(engine)() as session, session.begin():
                return (await create_key(session, project))[0]
        finally:
            await engine.dispose()

    return asyncio.run(go())


@pytest.fixture(scope="module")
def api(stub_url, postgres_server, run_dir) -> Api:
    with fresh_database(postgres_server) as database_url:
        key = make_key(database_url, "schema")
        limits = ["--max-tokens", str(SETTINGS.auth.max_tokens), "--max-n", str(SETTINGS.auth.max_n)]
        with running_proxy([stub_url], database_url, run_dir, "proxy-openapi", "--admin-key", ADMIN_KEY,
                           *limits) as url:
            yield Api(url, key)


def test_the_document_describes_this_server(api: Api):
    doc = requests.get(f"{api.url}/openapi.json").json()
    assert doc == DOCUMENT
    assert doc["openapi"].startswith("3.")
    paths = doc["paths"]
    for path in ("/rollouts", "/reward", "/rollouts/{rollout_id}", "/policies", "/policies/{version}/activate",
                 "/healthz", "/readyz", "/metrics", "/openapi.json", "/v1/chat/completions", "/v1/completions",
                 "/v1/models", "/rollouts/{rollout_id}/v1/chat/completions",
                 "/rollouts/{rollout_id}/agents/{agent}/v1/models", "/v1/traces"):
        assert path in paths, path
    chat = paths["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
    assert chat["schema"]["required"] == ["model", "messages"]  # from proxy/schemas.py
    assert chat["schema"]["properties"]["max_tokens"]["maximum"] == 64  # the limit this server enforces
    assert chat["example"]["model"] == "stub-model"  # the model this server serves
    assert paths["/policies/{version}/activate"]["post"]["security"] == [{"bearerAuth": []}]
    assert "security" not in paths["/healthz"]["get"]



@schema.parametrize()
@settings(max_examples=12, deadline=None, derandomize=True,  # the same cases on every run: no flaky CI
          suppress_health_check=list(HealthCheck))
def test_every_operation_keeps_the_document(case, api: Api):
    admin = case.path in ("/policies/{version}/activate", "/metrics")
    key = ADMIN_KEY if admin else api.agent_key
    case.call_and_validate(base_url=api.url, headers={"Authorization": f"Bearer {key}"}, checks=CHECKS,
                           timeout=30)


def test_every_error_the_proxy_raises_has_the_documented_shape():
    """Error bodies are built in proxy/errors.py (and the Messages dialect) on the hot path, not through the
    models; their shapes are the documented ones all the same."""
    from proxy import errors
    from proxy.bodies import AnthropicError, Error
    from proxy.dialects.messages import error_body as anthropic_error_body

    raised = [cls for cls in vars(errors).values()
              if isinstance(cls, type) and issubclass(cls, errors.ProxyError) and cls is not errors.ProxyError]
    assert len(raised) >= 10
    for cls in raised:
        error = cls("what went wrong", retry_after=3) if cls is errors.RateLimited else cls("what went wrong")
        Error.model_validate(error.body())
        AnthropicError.model_validate(anthropic_error_body(cls.status, "what went wrong"))


def test_every_route_the_proxy_serves_itself_is_documented_and_nothing_else():
    """The routes are registered from the same table the document is generated from; the engine's own routes
    relayed beside them (proxy/engine_routes.py) are the only ones that are not in it."""
    from proxy.app import build_app
    from proxy.routes.passthrough import passthrough

    app = build_app(SETTINGS)
    served = {(route.method.lower(), route.resource.canonical) for route in app.router.routes()
              if route.method != "HEAD" and route.handler is not passthrough}
    documented = {(method, path) for path, operations in DOCUMENT["paths"].items() for method in operations}
    assert served == documented
    assert ("post", "/rollouts/{rollout_id}/agents/{agent}/v1/messages") in served
