"""The request boundary (proxy/boundary.py): every body that reaches the engine is read once by one set of rules,
checked, and sent as the bytes the proxy serialised from what it checked. A real `rlproxy serve` with keys on,
Postgres, and the stand-in engine keeping every body it receives (`Stub.bodies`): project alpha's key tries to
reach beta's adapter with every encoding the engine's own JSON parser reads but the proxy's rules refuse, on every
route that forwards a body; none of them may reach the engine."""
from __future__ import annotations

import json

import anthropic
import orjson
import pytest
import requests

from proxy.edge.engine_routes import RELAYED
from testkit.stub_engine import BASE_MODEL, Stub
from tests.support import fresh_database, running_proxy
from tests.tenants import RELAYED_BODIES, engine_in_thread

USER = [{"role": "user", "content": "What is 6*7?"}]
ANTHROPIC_ROUTES = ("/v1/messages", "/v1/messages/count_tokens")
# Every route that forwards a JSON body, with a body it serves.
ROUTES = {
    "/v1/chat/completions": {"messages": USER},
    "/v1/completions": {"prompt": "6*7="},
    "/v1/responses": {"input": "What is 6*7?"},
    "/v1/messages": {"max_tokens": 8, "messages": USER},
    "/v1/messages/count_tokens": {"messages": USER},
    **RELAYED_BODIES,
}


def body_text(path: str, model: str) -> str:
    """The route's body with `model`, written with spaces, as JSON text to be altered."""
    return json.dumps({"model": model, **ROUTES[path]})


def with_field(text: str, raw_field: str) -> str:
    return text[:-1] + ", " + raw_field + "}"


# Forms of a body naming beta's adapter that Python's json module (the engine's) reads and the proxy refuses;
# each is given the body's JSON text and the adapter names of alpha and beta (`tenants.adapters`).
REFUSED = {
    "NaN": lambda t, alphas, betas: with_field(t, '"temperature": NaN').encode(),
    "Infinity": lambda t, alphas, betas: with_field(t, '"temperature": Infinity').encode(),
    "-Infinity": lambda t, alphas, betas: with_field(t, '"temperature": -Infinity').encode(),
    "1e999": lambda t, alphas, betas: with_field(t, '"temperature": 1e999').encode(),
    "UTF-8 BOM": lambda t, alphas, betas: b"\xef\xbb\xbf" + t.encode(),
    "UTF-16": lambda t, alphas, betas: t.encode("utf-16"),
    "UTF-16LE": lambda t, alphas, betas: t.encode("utf-16-le"),
    "UTF-16BE": lambda t, alphas, betas: t.encode("utf-16-be"),
    "UTF-32": lambda t, alphas, betas: t.encode("utf-32"),
    "UTF-32BE": lambda t, alphas, betas: t.encode("utf-32-be"),
    "lone surrogate": lambda t, alphas, betas: with_field(t, '"user": "x\\ud800"').encode(),
    "lone low surrogate": lambda t, alphas, betas: t.replace(f'"{betas}"', f'"{betas}\\udc00"').encode(),
    "model twice, beta's last": lambda t, alphas, betas: with_field(t.replace(betas, alphas),
                                                                    f'"model": "{betas}"').encode(),
    "model twice, beta's first": lambda t, alphas, betas: with_field(t, f'"model": "{alphas}"').encode(),
    "model twice, once escaped": lambda t, alphas, betas: with_field(t.replace(betas, alphas),
                                                                     f'"mod\\u0065l": "{betas}"').encode(),
    "a nested key twice": lambda t, alphas, betas: with_field(t, '"x": {"a": 1, "a": 2}').encode(),
    "deep nesting": lambda t, alphas, betas: with_field(t, '"x": ' + "[" * 100 + "]" * 100).encode(),
}


def escaped(name: str, position: int) -> str:
    """`name` as JSON text with the character at `position` written as a \\u escape."""
    return name[:position] + f"\\u{ord(name[position]):04x}" + name[position + 1:]


def post(tenants, who: str, path: str, raw: bytes, **headers) -> requests.Response:
    return requests.post(tenants.url + path, data=raw, timeout=30, headers={
        **tenants.headers(who), "Content-Type": "application/json", **headers})


def engine_bodies(stub: Stub) -> list[tuple[str, bytes]]:
    return [(path, body) for path, body in stub.bodies if path != "/v1/models"]  # the proxy's health probes


def refusal(response: requests.Response, path: str) -> str:
    """The 400's message, its shape checked: Anthropic's on the Messages routes, OpenAI's elsewhere."""
    assert response.status_code == 400, (path, response.status_code, response.text)
    body = response.json()
    if path in ANTHROPIC_ROUTES:
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
        return body["error"]["message"]
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["code"] in ("invalid_json", "json_too_deep"), body
    return body["error"]["message"]


def test_no_form_the_rules_refuse_reaches_the_engine_on_any_route(tenants):
    assert {path for path, methods in RELAYED.items() if "POST" in methods} - ROUTES.keys() == {"/ping"}  # no body
    tenants.stub.bodies.clear()
    for path in ROUTES:
        text = body_text(path, tenants.adapters["beta"])
        for form, encode in REFUSED.items():
            message = refusal(post(tenants, "alpha", path, encode(text, tenants.adapters["alpha"],
                                                                  tenants.adapters["beta"])), path)
            assert "JSON" in message or "nests" in message, (path, form, message)
    assert engine_bodies(tenants.stub) == []


def test_beta_s_adapter_is_beta_s_however_its_name_is_written(tenants):
    """Escapes the rules accept are read as the name they spell: 404, as for the plain name."""
    betas = tenants.adapters["beta"]  # rlproxy-v2-<random>
    tenants.stub.bodies.clear()
    for path in ROUTES:
        # plain; the version's digit escaped (rlproxy-v\u0032-…); the first letter; the random part's last
        for spelling in (betas, escaped(betas, len("rlproxy-v")), escaped(betas, 0),
                         escaped(betas, len(betas) - 1)):
            raw = body_text(path, betas).replace(f'"{betas}"', f'"{spelling}"').encode()
            response = post(tenants, "alpha", path, raw)
            assert response.status_code == 404, (path, spelling, response.text)
            assert betas in response.text
    assert engine_bodies(tenants.stub) == []


def test_the_engine_receives_the_bytes_serialised_from_the_checked_body(tenants):
    # A relayed route: the client's spacing and escapes are gone, the object is the one checked.
    alphas = tenants.adapters["alpha"]
    raw = b'{ "model" : "%s" ,\n "prompt": "caf\\u00e9 one two" }' % alphas.encode()
    tenants.stub.bodies.clear()
    response = post(tenants, "alpha", "/tokenize", raw, **{"X-Request-Id": "chosen-by-the-client",
                                                            "Content-Encoding": "identity", "X-Other": "x"})
    assert response.status_code == 200, response.text
    assert engine_bodies(tenants.stub) == [("/tokenize", orjson.dumps(orjson.loads(raw)))]
    [names] = [names for (path, _), names in zip(tenants.stub.bodies, tenants.stub.header_names)
               if path == "/tokenize"]
    assert {"x-request-id", "content-encoding", "x-other"} & names == set()  # the client's headers stay here
    assert engine_bodies(tenants.stub)[0][1] == f'{{"model":"{alphas}","prompt":"café one two"}}'.encode()

    # Every relayed route (the engine's answer aside: a generative model's engine has no pooling routes).
    for path, body in RELAYED_BODIES.items():
        raw = json.dumps({"model": alphas, **body}, indent=2).encode()  # laid out as the proxy never writes
        tenants.stub.bodies.clear()
        assert post(tenants, "alpha", path, raw).status_code in (200, 404)
        assert engine_bodies(tenants.stub) == [(path, orjson.dumps(json.loads(raw)))], path

    # A recorded route: the checked body, plus only what the proxy adds to capture the call and route it.
    raw = b'{"model": "stub-model",  "messages": [{"role": "user", "content": "\\u0036*7?"}], "seed": 7}'
    tenants.stub.bodies.clear()
    response = post(tenants, "alpha", "/v1/chat/completions", raw)
    assert response.status_code == 200, response.text
    [(path, sent)] = engine_bodies(tenants.stub)
    engine = orjson.loads(sent)
    assert path == "/v1/chat/completions" and sent == orjson.dumps(engine)
    assert engine == {**orjson.loads(raw), "return_token_ids": True, "logprobs": True, "model": alphas}


def test_fields_that_steer_the_engine_are_refused_naming_them(tenants):
    tenants.stub.bodies.clear()
    chat = {"model": BASE_MODEL, "messages": USER}
    for field, value in (("priority", -10), ("request_id", "someone-elses"), ("kv_transfer_params", {"do": 1}),
                         ("chat_template", "{{ 'x' }}"), ("vllm_xargs", {"a": 1}), ("use_beam_search", True)):
        answer = requests.post(f"{tenants.url}/v1/chat/completions", json={**chat, field: value},
                               headers=tenants.headers("alpha"))
        assert answer.status_code == 400 and answer.json()["error"]["param"] == field, answer.text
        assert answer.json()["error"]["code"] == "unsupported_parameter"
        relayed = requests.post(f"{tenants.url}/tokenize", json={"prompt": "x", field: value},
                                headers=tenants.headers("alpha"))
        assert relayed.status_code == 400 and relayed.json()["error"]["param"] == field, relayed.text
    hidden = requests.post(f"{tenants.url}/v1/chat/completions", headers=tenants.headers("alpha"), json={
        **chat, "chat_template_kwargs": {"chat_template": "{{ 'x' }}"}})
    assert hidden.status_code == 400 and hidden.json()["error"]["param"] == "chat_template"
    for path, body in (("/v1/completions", {"model": BASE_MODEL, "prompt": "x"}), ("/tokenize", {"prompt": "x"}),
                       ("/v1/chat/completions", chat)):
        unknown = requests.post(tenants.url + path, headers=tenants.headers("alpha"), json={**body, "no_such": 1})
        assert unknown.status_code == 400 and unknown.json()["error"]["code"] == "unknown_parameter", path
        assert unknown.json()["error"]["param"] == "no_such"
    with pytest.raises(anthropic.BadRequestError) as messages:
        tenants.anthropic("alpha").messages.create(model=BASE_MODEL, max_tokens=8, messages=USER,
                                                    extra_body={"priority": -10})
    assert "priority" in messages.value.message
    assert engine_bodies(tenants.stub) == []


def test_chat_template_kwargs_reach_the_engine_on_chat_and_messages(tenants):
    """Claude Code turns Qwen3's thinking off with CLAUDE_CODE_EXTRA_BODY={"chat_template_kwargs": …}."""
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    tenants.openai("alpha").chat.completions.create(model=BASE_MODEL, messages=USER, extra_body=off)
    assert tenants.stub.last_body["chat_template_kwargs"] == {"enable_thinking": False}
    tenants.stub.last_body = None
    claude = tenants.anthropic("alpha")
    claude.messages.create(model=BASE_MODEL, max_tokens=8, messages=USER, extra_body=off)
    assert tenants.stub.last_body["chat_template_kwargs"] == {"enable_thinking": False}
    assert claude.messages.count_tokens(model=BASE_MODEL, messages=USER, extra_body=off).input_tokens > 0
    tenants.openai("alpha").responses.create(model=BASE_MODEL, input="6*7?", extra_body={
        **off, "top_k": 5, "min_p": 0.1, "seed": 3, "repetition_penalty": 1.1})
    assert {k: tenants.stub.last_body.get(k) for k in ("chat_template_kwargs", "top_k", "min_p", "seed")} == {
        **off, "top_k": 5, "min_p": 0.1, "seed": 3}


BUDGET = 8


@pytest.fixture(scope="module")
def budgeted(postgres_server, run_dir):
    """A proxy with `--max-tokens 8` that lets its operator's clients set `priority`; yields (url, stub)."""
    stub = Stub(BASE_MODEL)
    with engine_in_thread(stub) as engine_url, fresh_database(postgres_server) as database_url, \
            running_proxy([engine_url], database_url, run_dir, "proxy-budget", "--max-tokens", str(BUDGET),
                          "--allow-request-field", "priority") as url:
        yield url, stub


def sent(stub: Stub) -> dict:
    [(_, body)] = engine_bodies(stub)
    stub.bodies.clear()
    return orjson.loads(body)


def test_the_budget_bounds_every_call_whether_or_not_the_client_set_one(budgeted):
    url, stub = budgeted
    stub.bodies.clear()
    chat = {"model": BASE_MODEL, "messages": USER}

    assert requests.post(f"{url}/v1/chat/completions", json=chat).status_code == 200
    assert sent(stub)["max_tokens"] == BUDGET
    assert requests.post(f"{url}/v1/chat/completions", json={**chat, "max_tokens": None}).status_code == 200
    assert sent(stub)["max_tokens"] == BUDGET
    assert requests.post(f"{url}/v1/chat/completions", json={**chat, "max_completion_tokens": 3}).status_code == 200
    assert "max_tokens" not in (engine := sent(stub)) and engine["max_completion_tokens"] == 3
    assert requests.post(f"{url}/v1/completions", json={"model": BASE_MODEL, "prompt": "x"}).status_code == 200
    assert sent(stub)["max_tokens"] == BUDGET
    assert requests.post(f"{url}/v1/responses", json={"model": BASE_MODEL, "input": "x"}).status_code == 200
    assert sent(stub)["max_tokens"] == BUDGET
    ok = requests.post(f"{url}/v1/chat/completions", json={**chat, "min_tokens": BUDGET, "ignore_eos": True})
    assert ok.status_code == 200 and sent(stub)["max_tokens"] == BUDGET

    for body, param in (({**chat, "min_tokens": 100_000, "ignore_eos": True}, "min_tokens"),
                        ({**chat, "max_tokens": 4, "min_tokens": 5}, "min_tokens"),
                        ({**chat, "max_tokens": BUDGET + 1}, "max_tokens"),
                        ({**chat, "max_completion_tokens": BUDGET + 1}, "max_completion_tokens")):
        refused = requests.post(f"{url}/v1/chat/completions", json=body)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param, refused.text
    refused = requests.post(f"{url}/v1/responses", json={"model": BASE_MODEL, "input": "x",
                                                         "max_output_tokens": BUDGET + 1})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_output_tokens"
    refused = requests.post(f"{url}/v1/messages", json={"model": BASE_MODEL, "messages": USER,
                                                        "max_tokens": BUDGET + 1})
    assert refused.status_code == 400 and refused.json()["type"] == "error"
    assert engine_bodies(stub) == []


def test_an_operator_may_allow_a_field_on_every_route(budgeted):
    url, stub = budgeted
    stub.bodies.clear()
    chat = requests.post(f"{url}/v1/chat/completions", json={"model": BASE_MODEL, "messages": USER, "priority": 1})
    assert chat.status_code == 200 and sent(stub)["priority"] == 1
    response = requests.post(f"{url}/v1/responses", json={"model": BASE_MODEL, "input": "x", "priority": 2})
    assert response.status_code == 200 and sent(stub)["priority"] == 2  # carried into the translated request
    refused = requests.post(f"{url}/v1/chat/completions", json={"model": BASE_MODEL, "messages": USER,
                                                                "request_id": "mine"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "request_id"


def test_media_the_engine_would_fetch_by_url_is_refused_on_every_wire_format_and_inline_media_passes(tenants):
    """A multimodal engine fetches an image URL from wherever it points, inside the operator's network: refused
    on chat, Responses and Messages (the proxy checks the request it would send, in chat form) and on the relayed
    /tokenize; sent inline as a data: URL it is not refused for that (a text model then answers for itself)."""
    key = tenants.keys["alpha"]
    headers = {"Authorization": f"Bearer {key}"}
    internal = "http://169.254.169.254/latest/meta-data/"
    chat_part = {"type": "image_url", "image_url": {"url": internal}}
    refused = {
        "/v1/chat/completions": {"model": BASE_MODEL, "messages": [{"role": "user", "content": [chat_part]}]},
        "/v1/responses": {"model": BASE_MODEL, "input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "HTTPS://example.internal/x.png"}]}]},
        "/v1/messages": {"model": BASE_MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "file:///etc/passwd"}}]}]},
        "/tokenize": {"model": BASE_MODEL, "messages": [{"role": "user", "content": [chat_part]}]},
    }
    before = len(engine_bodies(tenants.stub))
    for path, body in refused.items():
        answer = requests.post(f"{tenants.url}{path}", json=body, headers=headers, timeout=30)
        assert answer.status_code == 400, (path, answer.text)
        assert "media by URL would be fetched" in answer.json()["error"]["message"], path
    assert len(engine_bodies(tenants.stub)) == before  # none reached the engine
    inline = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    answer = requests.post(f"{tenants.url}/v1/chat/completions", headers=headers, timeout=30,
                        json={"model": BASE_MODEL, "messages": [{"role": "user", "content": [inline]}]})
    assert "media by URL" not in answer.text
