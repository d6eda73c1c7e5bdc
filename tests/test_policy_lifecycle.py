"""The policy lifecycle (engine/lifecycle.py) and its engine-adapter client (engine/adapters.py): what a
replica holds under a version's name is the version's own weights before it serves, whatever was there.

The rollback test uses the real vLLM engine (tests/engine_fixture.py) and compares logprobs; the others use
the stub engine, which keeps adapters the way vLLM's API server does (by name, refusing a name it holds)."""
from __future__ import annotations

from pathlib import Path

import pytest
import requests

from engine import lifecycle
from engine.adapters import AdapterRefused, EngineAdapters, EngineUnavailable, LoadFailed
from store import policies
from store.db import open_database, session_factory
from tests.support import free_port, running_proxy

PROMPT = [{"role": "user", "content": "Name a colour."}]


def random_lora(out: Path, seed: int) -> str:
    """A rank-8 LoRA with random nonzero weights for the bundled model: each seed answers differently."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from engine.model import prepare_model

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(prepare_model(), dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False,
                        task_type="CAUSAL_LM")
    get_peft_model(model, config).save_pretrained(out)
    return str(out)


def answer(url: str, model: str) -> list[tuple[str, float]]:
    """(token, logprob) of a short greedy answer."""
    reply = requests.post(f"{url}/v1/chat/completions", timeout=120, json={
        "model": model, "messages": PROMPT, "max_tokens": 4, "temperature": 0, "logprobs": True})
    assert reply.status_code == 200, reply.text
    return [(e["token"], e["logprob"]) for e in reply.json()["choices"][0]["logprobs"]["content"]]


def same(a: list[tuple[str, float]], b: list[tuple[str, float]]) -> bool:
    return [t for t, _ in a] == [t for t, _ in b] and all(abs(x - y) < 1e-3 for (_, x), (_, y) in zip(a, b))


@pytest.mark.engine
async def test_a_rollback_serves_the_versions_own_weights_when_its_name_holds_others(
        engine_url, engine_model, own_database_url, tmp_path):
    """v1 (adapter A) served, then v2 (adapter B). The engine then holds `rlproxy-v1` loaded from B's folder
    (as another store would leave it after a database reset) when an admin rolls back to v1 through the
    proxy: the proxy's answers are A's."""
    a, b = random_lora(tmp_path / "a", seed=1), random_lora(tmp_path / "b", seed=2)
    engine = EngineAdapters([engine_url])
    for name, folder in (("reference-a", a), ("reference-b", b)):
        await engine.load(name, folder)
    weights_a, weights_b = answer(engine_url, "reference-a"), answer(engine_url, "reference-b")
    assert not same(weights_a, weights_b)  # else this test could not tell them apart

    store = open_database(own_database_url)
    sessions = session_factory(store)
    try:
        async with sessions() as session, session.begin():
            await policies.add_candidate(session, 1, a, parent_version=0, base_model=engine_model)
            await policies.add_candidate(session, 2, b, parent_version=1, base_model=engine_model)
        await lifecycle.publish(sessions, engine, 1, activate=True)
        await lifecycle.publish(sessions, engine, 2, activate=True)
        assert same(answer(engine_url, "rlproxy-v1"), weights_a)

        await engine.load("rlproxy-v1", b)  # other weights under v1's name
        assert same(answer(engine_url, "rlproxy-v1"), weights_b)
        with running_proxy([engine_url], own_database_url, tmp_path) as proxy:
            rolled_back = requests.post(f"{proxy}/policies/1/activate", timeout=120)
            assert rolled_back.status_code == 200, rolled_back.text
            assert same(answer(proxy, engine_model), weights_a)
            listed = {p["version"]: p["status"] for p in requests.get(f"{proxy}/policies").json()["data"]}
        assert listed == {0: "retired", 1: "active", 2: "retired"}
        assert (await engine.listed())[engine_url]["rlproxy-v1"] == a
    finally:
        await store.dispose()


def adapter_folder(path: Path) -> str:
    """A folder the stub engine takes as an adapter."""
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text("{}")
    (path / "adapter_model.safetensors").write_bytes(b"\0")
    return str(path)


def held(stub_url: str) -> dict[str, str]:
    models = requests.get(f"{stub_url}/v1/models", timeout=10).json()["data"]
    return {m["id"]: m["root"] for m in models if m["parent"]}


async def test_a_load_replaces_what_is_held_under_the_name_and_keeps_a_serving_copy(stub_url, tmp_path):
    ours, other = adapter_folder(tmp_path / "ours"), adapter_folder(tmp_path / "other")
    engine = EngineAdapters([stub_url])
    await engine.load("lifecycle-x", other)
    await engine.load("lifecycle-x", ours)  # the default, for what serves nothing yet: always from `ours`
    assert held(stub_url)["lifecycle-x"] == ours

    # replace=False (a serving adapter): kept when held from its own folder, replaced when held from another,
    # loaded again when the engine lost it
    requests.post(f"{stub_url}/v1/unload_lora_adapter", json={"lora_name": "lifecycle-x"}, timeout=10)
    await engine.load("lifecycle-x", ours, replace=False)
    assert held(stub_url)["lifecycle-x"] == ours
    await engine.load("lifecycle-x", other, replace=False)
    assert held(stub_url)["lifecycle-x"] == other

    await engine.unload("lifecycle-x")
    await engine.unload("lifecycle-x")  # not held: what was asked
    assert "lifecycle-x" not in held(stub_url)


async def test_a_replica_that_refuses_leaves_the_adapter_on_none_with_typed_errors(stub_url, tmp_path):
    down = f"http://127.0.0.1:{free_port()}"
    both = EngineAdapters([stub_url, down], attempts=1)
    with pytest.raises(LoadFailed) as failed:
        await both.load("lifecycle-y", adapter_folder(tmp_path / "y"))
    assert isinstance(failed.value.failures[down], EngineUnavailable)
    assert stub_url not in failed.value.failures
    assert "lifecycle-y" not in held(stub_url)  # the replica that took it does not keep what cannot serve

    with pytest.raises(LoadFailed) as refused:
        await EngineAdapters([stub_url]).load("lifecycle-y", str(tmp_path / "not-an-adapter"))
    error = refused.value.failures[stub_url]
    assert isinstance(error, AdapterRefused) and error.status == 400 and "No adapter found" in str(error)


async def test_the_drain_unloads_what_stopped_serving_and_what_a_gate_retired(stub_url, own_database_url,
                                                                               tmp_path):
    engine = EngineAdapters([stub_url])
    store = open_database(own_database_url)
    sessions = session_factory(store)
    drain = lifecycle.Drain(drain_seconds=0)
    try:
        async with sessions() as session, session.begin():
            for version in (1, 2, 3):
                await policies.add_candidate(session, version, adapter_folder(tmp_path / f"v{version}"),
                                             parent_version=version - 1, base_model="stub-model")
        await lifecycle.publish(sessions, engine, 1, activate=True)
        assert await drain.sweep(sessions, engine) == []  # v1 serves
        await lifecycle.publish(sessions, engine, 2)
        await lifecycle.activate(sessions, engine, 2)  # v1 stops serving: seen by the next sweep
        await lifecycle.publish(sessions, engine, 3)
        await lifecycle.retire(sessions, 3, drain=drain)  # a gate kept it out
        assert sorted(await drain.sweep(sessions, engine)) == ["rlproxy-v1", "rlproxy-v3"]
        assert {"rlproxy-v1", "rlproxy-v3"}.isdisjoint(held(stub_url)) and "rlproxy-v2" in held(stub_url)

        # a rollback loads v1 again from its own folder, and the drain leaves what serves alone
        await lifecycle.activate(sessions, engine, 1)
        assert held(stub_url)["rlproxy-v1"] == str(tmp_path / "v1")
        assert await drain.sweep(sessions, engine) == ["rlproxy-v2"]
    finally:
        await engine.unload("rlproxy-v1")
        await store.dispose()
