"""The engine routes relayed beside the recorded ones: only those of the allow-list (proxy/edge/engine_routes.py), and
exactly as listed. A corpus of request paths is sent, as raw bytes, to a secured proxy whose engine keeps the raw
path of every request it receives (tests/tenants.py): nothing outside the list may reach it, whatever the
spelling, and what is listed must reach it as the listed path, with no query string (none of these routes reads
one: a request carrying one is refused, tests/test_deny_by_default.py)."""
from __future__ import annotations

import json

import requests

from proxy.edge.engine_routes import RELAYED
from tests.tenants import MAX_BODY, RELAYED_BODIES, received, send



# Dot segments (raw, percent-encoded, any case), encoded slashes, double and trailing slashes, case variants,
# inside or around the rollout prefixes; `{rid}` is a rollout of the caller's project, `{alpha}` and `{beta}` the
# adapter names of alpha and beta (tests/tenants.py).
SPELLINGS = [
    "/x/../v1/load_lora_adapter", "/x/%2e%2e/v1/load_lora_adapter", "/x/%2E%2E/v1/unload_lora_adapter",
    "/x/.%2E/sleep", "/x/%2e./collective_rpc", "/./tokenize", "/%2e/tokenize", "/tokenize/..",
    "/tokenize/%2e%2e", "/v1/embeddings/%2e%2e/%2e%2e/invocations", "/x/%2e%2e/v1/completions",
    "/rollouts/{rid}/%2e%2e/%2e%2e/v1/load_lora_adapter", "/rollouts/{rid}/agents/a/../../../../sleep",
    "/rollouts/{rid}/agents/a/%2E%2e/%2e%2E/%2e%2e/%2e%2e/v1/chat/completions/batch", "/rollouts/%2e%2e/tokenize",
    "/rollouts/../tokenize", "/rollouts/{rid}/agents/%2e/tokenize", "/rollouts/{rid}/agents/../tokenize",
    "/v1%2fload_lora_adapter", "/v1%2Fembeddings", "/x%2f..%2fsleep", "/x/..%2fsleep", "/x%5c..%5csleep",
    "/rollouts/{rid}%2f..%2f..%2fsleep", "/rollouts/a%2fb/tokenize",
    "//tokenize", "/v1//embeddings", "/tokenize/", "/v1/embeddings/", "/rollouts/{rid}//tokenize",
    "/Tokenize", "/TOKENIZE", "/V1/embeddings", "/v1/Embeddings", "/tokenize;x=1", "/tokenize%00",
    "/tokenize?next=/../sleep&x=%2e%2e%2f", "/tokenize?model={beta}", "/rollouts/{rid}/tokenize?x", "/ping?a=1",
]
# vLLM 0.32's administration routes and its generation outside the recorded routes, bare and under the prefixes.
ENGINE_ONLY = [
    "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/adapters", "/invocations", "/v1/chat/completions/batch",
    "/abort_requests", "/inference/v1/abort_requests", "/inference/v1/generate", "/sleep", "/wake_up",
    "/collective_rpc", "/reset_prefix_cache", "/reset_mm_cache", "/release_kv_cache_memory",
    "/start_weight_update", "/finish_weight_update", "/init_weight_transfer_engine", "/update_weight_version",
    "/update_weights", "/weight_checker", "/fault_tolerance/apply", "/pause", "/resume", "/start_profile",
    "/scale_elastic_ep", "/v1/responses/resp_1/cancel", "/v1/messages/batches", "/v1/audio/transcriptions",
    "/v1/audio/translations", "/v1/chat/completions/render", "/v1/responses/render", "/generative_scoring",
    "/v1/systemone", "/cohere/v2/chat", "/rollouts/{rid}/v1/load_lora_adapter", "/rollouts/{rid}/invocations",
    "/rollouts/{rid}/agents/a/sleep", "/rollouts/{rid}/agents/a/v1/chat/completions/batch",
]
OTHER_METHODS = [("DELETE", "/adapters/{alpha}"), ("GET", "/is_sleeping"), ("GET", "/server_info"),
                 ("GET", "/tokenizer_info"), ("GET", "/load"), ("GET", "/nowhere"),
                 ("GET", "/rollouts/{rid}/nowhere"), ("GET", "/tokenize"), ("PUT", "/tokenize"),
                 ("DELETE", "/v1/embeddings"), ("POST", "/health"), ("PATCH", "/version"), ("OPTIONS", "/tokenize")]
REFUSED = [("POST", p) for p in SPELLINGS + ENGINE_ONLY] + OTHER_METHODS

# (method, path asked, path the engine must get: the listed one, with no query)
RELAYED_AS = [(method, path, path) for path, methods in RELAYED.items() for method in methods] + [
    ("POST", "/rollouts/{rid}/tokenize", "/tokenize"),
    ("POST", "/rollouts/{rid}/agents/solver/v1/embeddings", "/v1/embeddings"),
    ("POST", "/tokenize?", "/tokenize"),  # an empty query: nothing to refuse, nothing sent on
    ("POST", "/tok%65nize", "/tokenize"),  # a spelling of a listed path: the engine gets the listed one
]


def test_no_path_outside_the_list_reaches_the_engine_however_it_is_spelled(tenants):
    rid = tenants.rollout("alpha")["rollout_id"]
    tenants.stub.received.clear()
    answers = {(method, target): send(tenants.url, method, target.format(rid=rid, **tenants.adapters),
                                      tenants.keys["alpha"])
               for method, target in REFUSED}

    assert received(tenants) == []
    for (method, target), (status, body) in answers.items():
        assert status in (400, 404, 405), (method, target, status, body)
        anthropic = "/v1/messages/" in target  # a Messages API path: its client reads Anthropic's shape
        assert set(json.loads(body)["error"]) == ({"message", "type"} if anthropic else {"message", "type", "param",
                                                                                           "code"}), target
    assert answers[("POST", "/x/%2e%2e/v1/load_lora_adapter")][0] == 404
    assert answers[("POST", "/rollouts/../tokenize")][0] == 400  # `..` is no rollout id
    assert answers[("GET", "/tokenize")][0] == 405  # a listed path, another method
    assert answers[("POST", "/tokenize?next=/../sleep&x=%2e%2e%2f")][0] == 400  # once relayed with its query
    assert send(tenants.url, "POST", "/x/%2e%2e/v1/load_lora_adapter", None)[0] == 401  # no key: nothing shown
    assert received(tenants) == []


def test_listed_routes_reach_the_engine_as_exactly_the_listed_path(tenants):
    rid = tenants.rollout("alpha")["rollout_id"]
    for method, target, expected in RELAYED_AS:
        tenants.stub.received.clear()
        body = json.dumps(RELAYED_BODIES.get(expected.split("?")[0], {})).encode()
        status, answer = send(tenants.url, method, target.format(rid=rid), tenants.keys["alpha"], body)
        assert received(tenants) == [(method, expected)], (target, status, answer)
    # what the engine answers comes back as it is (its missing pooling routes: the proxy's own 404)
    direct = requests.post(f"{tenants.stub_url}/tokenize", json={"prompt": "one two"}).content
    assert send(tenants.url, "POST", f"/rollouts/{rid}/tokenize", tenants.keys["alpha"]) == (200, direct)
    status, body = send(tenants.url, "POST", "/v1/embeddings", tenants.keys["alpha"], b'{"input": "one two"}')
    assert status == 404 and b"no route POST /v1/embeddings" in body
    assert tenants.calls("alpha", rid) == []  # relayed, never recorded


def test_a_relayed_call_keeps_the_keys_tenant_scope_and_the_body_limit(tenants):
    rid = tenants.rollout("alpha")["rollout_id"]
    tenants.stub.received.clear()

    too_large = send(tenants.url, "POST", "/tokenize", tenants.keys["alpha"],
                     body=b'{"prompt": "' + b"x" * MAX_BODY + b'"}')
    assert too_large[0] == 413 and b"request_too_large" in too_large[1]
    assert received(tenants) == []

    # A relayed route records nothing and reads no rollout: under another project's id it answers as under an
    # unused one, so whether an id is taken does not show.
    other_project = send(tenants.url, "POST", f"/rollouts/{rid}/tokenize", tenants.keys["beta"])
    unused = send(tenants.url, "POST", "/rollouts/never-used/tokenize", tenants.keys["beta"])
    headed = requests.post(f"{tenants.url}/tokenize", json={"prompt": "one two"},
                           headers={**tenants.headers("beta"), "X-Rollout-Id": rid})
    assert other_project == unused and other_project[0] == 200
    assert headed.status_code == 200
    assert send(tenants.url, "POST", f"/rollouts/{rid}/tokenize", tenants.keys["alpha"])[0] == 200
