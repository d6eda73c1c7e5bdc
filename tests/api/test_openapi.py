"""`GET /openapi.json` describes the proxy as it runs, and the running proxy keeps to it: schemathesis sends
generated requests (valid and invalid) to every documented operation of a real `rlproxy serve` (auth on,
limits set, stub engine, Postgres) and checks that nothing answers 5xx and every answer matches the
document (status, content type, headers, body schema). The engine routes the proxy relays are documented and
checked too (bare, with fewer cases: their bodies are the engine's), and every JSON body is bounded in depth as
the document says."""
from __future__ import annotations

import asyncio
import copy
import re
from dataclasses import dataclass

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from core.settings import AuthSettings, ProxySettings
from proxy.edge.engine_routes import RELAYED
from proxy.strict_json import MAX_JSON_DEPTH
from proxy.api.openapi import openapi_document
from proxy.routes import documented_endpoints
from store.db import open_database, session_factory
from store.keys import create_key
from tests.support import fresh_database, running_proxy

ADMIN_KEY = "openapi-test-admin-key"
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]
# The document this server configuration serves, built here so the cases can be generated at collection time
# (the first test checks that the running server serves exactly this).
SETTINGS = ProxySettings(auth=AuthSettings(admin_key=ADMIN_KEY, max_tokens=64, max_n=4))
DOCUMENT = openapi_document(SETTINGS, documented_endpoints(), auth_enabled=True, served_model="stub-model")


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
# The relayed engine routes: an opaque JSON object in, the engine's answer out. A few fuzzed cases each (valid
# and invalid bodies and headers) cover them; the coverage phase's ~75 cases per operation would mostly repeat
# the context headers' cases already run on the recorded routes, for ~1 s per operation.
RELAYED_PATHS = "^(" + "|".join(re.escape(path) for path in RELAYED) + ")$"
# The Gemini API's methods are fuzzed under /v1beta, bare and under a rollout: their /v1 twins and the agent prefix
# run the same handlers on the same document (each checked documented below), ~3 s an operation.
GEMINI_TWINS = r"^(/rollouts/\{rollout_id\}/agents/\{agent\}/v1(beta)?/models.*|.*/v1/models/\{model\}:.*)$"
own_operations = schema.exclude(path_regex=RELAYED_PATHS).exclude(path_regex=GEMINI_TWINS)
relayed_operations = schemathesis.openapi.from_dict(DOCUMENT, config=SchemathesisConfig.from_dict(
    {"phases": {"coverage": {"enabled": False}}})).include(path_regex=RELAYED_PATHS)


@dataclass(frozen=True)
class Api:
    url: str
    agent_key: str


def make_key(database_url: str, project: str) -> str:
    async def go() -> str:
        database = open_database(database_url)
        try:
            async with session_factory(database)() as session, session.begin():
                return (await create_key(session, project))[0]
        finally:
            await database.dispose()

    return asyncio.run(go())


@pytest.fixture(scope="module")
def api(stub_url, postgres_server, run_dir) -> Api:
    with fresh_database(postgres_server) as database_url:
        key = make_key(database_url, "schema")
        limits = ["--max-tokens", str(SETTINGS.auth.max_tokens), "--max-n", str(SETTINGS.auth.max_n)]
        with running_proxy([stub_url], database_url, run_dir, "proxy-openapi", *limits,
                           stub_controls=False, env={"RLPROXY_ADMIN_KEY": ADMIN_KEY}) as url:  # the fields documented: the routes' own
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
    embeddings = paths["/v1/embeddings"]["post"]  # relayed: the engine's body and answer, the proxy's errors
    assert embeddings["requestBody"]["content"]["application/json"]["schema"]["type"] == "object"
    assert {"200", "400", "401", "404", "413", "429", "502", "503", "504", "4XX"} <= set(embeddings["responses"])
    assert "content" not in paths["/health"]["get"]["responses"]["200"]
    chat_body = paths["/v1/chat/completions"]["post"]["requestBody"]
    assert "more than 64 levels deep" in chat_body["description"] and "refused: 400" in chat_body["description"]
    assert "refused: 422" in paths["/reward"]["post"]["requestBody"]["description"]


# Headers that frame the HTTP message itself: a generated value for one (`content-length: }{0o1j(`) is a
# malformed request that aiohttp's parser refuses before any route runs, not a case of the document.
FRAMING_HEADERS = {"content-length", "transfer-encoding", "host", "connection", "expect", "te", "upgrade"}


def _call(case, api: Api) -> None:
    for name in [name for name in (case.headers or {}) if name.lower() in FRAMING_HEADERS]:
        del case.headers[name]
    admin = case.path in ("/policies/{version}/activate", "/metrics")
    key = ADMIN_KEY if admin else api.agent_key
    case.call_and_validate(base_url=api.url, headers={"Authorization": f"Bearer {key}"}, checks=CHECKS,
                           timeout=30)


@own_operations.parametrize()
@settings(max_examples=12, deadline=None, derandomize=True,  # the same cases on every run: no flaky CI
          suppress_health_check=list(HealthCheck))
def test_every_operation_keeps_the_document(case, api: Api):
    _call(case, api)


@relayed_operations.parametrize()
@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_every_relayed_operation_keeps_the_document(case, api: Api):
    _call(case, api)


def nested(levels: int) -> list:
    """A JSON array `levels` deep: [[[]]] is 3."""
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


def _concrete(path: str, rollout_id: str) -> str:
    path = path.replace("{rollout_id}", rollout_id).replace("{agent}", "depth-agent").replace("{model}", "stub-model")
    return path + "?alt=sse" if path.endswith(":streamGenerateContent") else path  # its documented query


def test_every_json_body_is_bounded_in_depth_as_documented(api: Api):
    """Each documented JSON request body, sent one level deeper than the bound, gets the status its description
    names and the documented error shape; one level less is relayed (a pooling route answers)."""
    agent = {"Authorization": f"Bearer {api.agent_key}"}
    rollout_id = requests.post(f"{api.url}/rollouts", json={}, headers=agent).json()["rollout_id"]
    too_deep = {"model": "stub-model", "x": nested(MAX_JSON_DEPTH)}  # the body is level 1
    checked = []
    for path, operations in DOCUMENT["paths"].items():
        for method, operation in operations.items():
            body = operation.get("requestBody", {})
            if "application/json" not in body.get("content", {}):
                continue
            status = int(re.search(r"refused: (\d{3}), error code `json_too_deep`", body["description"])[1])
            response = requests.request(method, api.url + _concrete(path, rollout_id), json=too_deep,
                                        headers=agent, timeout=30)
            assert response.status_code == status, (path, response.text)
            shape = operation["responses"][str(status)]["content"]["application/json"]["schema"]["$ref"]
            error = response.json()
            if shape.endswith("/AnthropicError"):
                assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", error
            elif shape.endswith("/GoogleError"):
                assert error["error"]["status"] == "INVALID_ARGUMENT", error
                assert (error["error"].get("details") or [{}])[0].get("reason") == "json_too_deep", (path, error)
            else:
                assert set(error["error"]) == {"message", "type", "param", "code"}, error
                assert error["error"]["code"] == "json_too_deep", (path, error)
            checked.append(path)
    assert {"/v1/chat/completions", "/v1/messages", "/v1/responses", "/rollouts", "/reward", "/v1/traces",
            "/tokenize", "/v1/embeddings", "/rollouts/{rollout_id}/agents/{agent}/v1/completions"} <= set(checked)
    deepest = {"model": "stub-model", "prompt": "six times seven",
               "chat_template_kwargs": {"x": nested(MAX_JSON_DEPTH - 2)}}
    tokenized = requests.post(f"{api.url}/tokenize", json=deepest, headers=agent, timeout=30)
    assert tokenized.status_code == 200 and tokenized.json()["count"] == 3, tokenized.text
    # A relayed body past what orjson writes (254) or reads (1,024) is refused the same; many shallow lists pass.
    embeddings = f"{api.url}/rollouts/{rollout_id}/v1/embeddings"
    for levels in (300, 2000):
        deep = requests.post(embeddings, data=b'{"input": ' + b"[" * levels + b"]" * levels + b"}",
                             headers={**agent, "Content-Type": "application/json"}, timeout=30)
        assert deep.status_code == 400 and deep.json()["error"]["code"] == "json_too_deep", (levels, deep.text)
    wide = requests.post(embeddings, json={"model": "stub-model", "input": [[i] for i in range(200)]},
                         headers=agent, timeout=30)
    assert wide.status_code == 200 and len(wide.json()["data"]) == 200, wide.text


def test_every_error_the_proxy_raises_has_the_documented_shape():
    """Error bodies are built in proxy/errors.py (and the Messages dialect) on the hot path, not through the
    models; their shapes are the documented ones all the same."""
    from proxy import errors
    from proxy.bodies import AnthropicError, Error
    from proxy.dialects.messages_objects import error_body as anthropic_error_body

    raised = [cls for cls in vars(errors).values()
              if isinstance(cls, type) and issubclass(cls, errors.ProxyError) and cls is not errors.ProxyError]
    assert len(raised) >= 10
    for cls in raised:
        error = cls("what went wrong", retry_after=3) if cls is errors.RateLimited else cls("what went wrong")
        Error.model_validate(error.body())
        AnthropicError.model_validate(anthropic_error_body(cls.status, "what went wrong"))


def test_every_route_the_proxy_serves_is_documented_and_nothing_else():
    """The routes are registered from the same tables the document is generated from; the engine routes relayed
    beside them (proxy/edge/engine_routes.py) are documented once, without the rollout prefixes they are also
    served under."""
    from proxy.app import build_app
    from proxy.api.endpoints import PREFIXES
    from proxy.routes.passthrough import passthrough

    app = build_app(SETTINGS)
    routes = [(route.method.lower(), route.resource.canonical, route.handler is passthrough)
              for route in app.router.routes() if route.method != "HEAD"]
    documented = {(method, path) for path, operations in DOCUMENT["paths"].items() for method in operations}
    relayed = {(method.lower(), path) for path, methods in RELAYED.items() for method in methods}
    assert {(method, path) for method, path, relays in routes if not relays} == documented - relayed
    assert relayed <= documented
    assert {(method, path) for method, path, relays in routes if relays} == {
        (method, prefix + path) for prefix in PREFIXES for method, path in relayed}
    assert ("post", "/rollouts/{rollout_id}/agents/{agent}/v1/messages") in documented
