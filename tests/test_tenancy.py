"""Adapters belong to their project: a key may call its own project's policies' adapters, the base model and the
served model name, on every route (chat, completions, Responses, Messages, relayed engine routes), and
`/v1/models` lists only those. Another project's adapter is answered as a model that does not exist, in the
route's error shape, and nothing of the attempt reaches the engine or the store (tests/tenants.py: alpha owns
its version 1's adapter, beta its version 2's, each named as its row keeps it: `tenants.adapters`)."""
from __future__ import annotations

import anthropic
import openai
import pytest
import requests

from core.policy_rules import PolicyRules
from testkit.stub_engine import BASE_MODEL

CHAT = [{"role": "user", "content": "What is 6*7?"}]


def not_found(model: str) -> dict:
    return {"message": f"The model `{model}` does not exist or you do not have access to it.",
            "type": "not_found_error", "param": "model", "code": "model_not_found"}


def test_a_project_reaches_the_policies_its_calls_can_be_routed_to():
    rules = PolicyRules.parse(["project:acme=acme", "agent:solver=solver", "project:duo&agent:checker=duo-checker",
                               "project:duo&agent:a&agent:b=never"], default="shared")
    assert rules.reachable("acme") == {"acme"}  # every acme call matches its rule before any other
    assert rules.reachable("duo") == {"solver", "duo-checker", "shared"}
    assert rules.reachable("other") == {"solver", "shared"}
    assert rules.reachable(None) == {"solver", "shared"}


def test_another_projects_adapter_is_a_model_that_does_not_exist_on_every_route(tenants):
    betas = tenants.adapters["beta"]
    rollout = tenants.rollout("alpha")
    client = tenants.openai("alpha", rollout["base_url"])
    claude = tenants.anthropic("alpha", rollout["base_url"].removesuffix("/v1"))
    tenants.stub.received.clear()

    with pytest.raises(openai.NotFoundError) as chat:
        client.chat.completions.create(model=betas, messages=CHAT)
    with pytest.raises(openai.NotFoundError) as streamed:
        client.chat.completions.create(model=betas, messages=CHAT, stream=True)
    with pytest.raises(openai.NotFoundError) as completion:
        client.completions.create(model=betas, prompt="6*7=")
    with pytest.raises(openai.NotFoundError) as response:
        client.responses.create(model=betas, input="What is 6*7?")
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="no-such-model", messages=CHAT)
    with pytest.raises(anthropic.NotFoundError) as message:
        claude.messages.create(model=betas, max_tokens=8, messages=CHAT)
    with pytest.raises(anthropic.NotFoundError) as counted:
        claude.messages.count_tokens(model=betas, messages=CHAT)
    tokenized = requests.post(f"{tenants.url}/tokenize", json={"model": betas, "prompt": "6*7="},
                              headers=tenants.headers("alpha"))

    for raised in (chat, streamed, completion, response):
        assert raised.value.response.json() == {"error": not_found(betas)}
    assert missing.value.response.json() == {"error": not_found("no-such-model")}  # alike: no name leaks
    for raised in (message, counted):
        assert raised.value.response.json() == {"type": "error", "error": {
            "type": "not_found_error", "message": not_found(betas)["message"]}}
    assert tokenized.status_code == 404 and tokenized.json() == {"error": not_found(betas)}
    assert [seen for seen in tenants.stub.received if seen != ("GET", "/v1/models")] == []
    assert tenants.calls("alpha", rollout["rollout_id"]) == []


def test_a_key_calls_its_own_adapter_the_served_model_and_the_base_model(tenants):
    def ask(who: str, model: str):
        return tenants.openai(who).chat.completions.with_raw_response.create(model=model, messages=CHAT)

    alphas, betas = tenants.adapters["alpha"], tenants.adapters["beta"]
    own = ask("alpha", alphas)
    served = {who: ask(who, BASE_MODEL).headers for who in ("alpha", "beta", "gamma")}
    tokenized = requests.post(f"{tenants.url}/tokenize", json={"model": alphas, "prompt": "6*7="},
                              headers=tenants.headers("alpha"))

    assert own.parse().model == alphas and "X-Rlproxy-Policy" not in own.headers  # by name: no routing
    assert [(h["X-Rlproxy-Policy-Name"], h["X-Rlproxy-Policy"]) for h in served.values()] == [
        ("alpha", "1"), ("beta", "2"), ("default", "0")]  # gamma has no rule: the default policy, no version yet
    assert tokenized.status_code == 200
    with pytest.raises(openai.NotFoundError):
        ask("gamma", alphas)
    assert ask("operator", betas).parse().model == betas  # the operator's key belongs to no project


def test_the_model_list_shows_each_key_only_what_it_may_call(tenants):
    def listed(who: str, base_url: str | None = None) -> set[str]:
        return {model.id for model in tenants.openai(who, base_url).models.list()}

    alphas, betas = tenants.adapters["alpha"], tenants.adapters["beta"]
    rollout = tenants.rollout("beta")
    assert listed("alpha") == {BASE_MODEL, alphas}
    assert listed("beta") == listed("beta", rollout["base_url"]) == {BASE_MODEL, betas}
    assert listed("gamma") == {BASE_MODEL}
    assert listed("operator") == {BASE_MODEL, alphas, betas}
