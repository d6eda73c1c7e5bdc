"""The policy lifecycle (engine/lifecycle.py) and its engine-adapter client (engine/adapters.py): what a
replica holds under a version's name is the version's own weights before it serves, whatever was there.

The rollback test uses the real vLLM engine (tests/engine_fixture.py) and compares logprobs; the others use
the stub engine, which keeps adapters the way vLLM's API server does (by name, refusing a name it holds)."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import requests

from engine import lifecycle
from engine.adapters import AdapterRefused, EngineAdapters, EngineUnavailable, LoadFailed
from store import policies, replicas
from store.db import open_database, session_factory
from testkit.stub_engine import BASE_MODEL, Stub
from tests.support import free_port, fresh_database, running_proxy
from tests.tenants import engine_in_thread

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
    """v1 (adapter A) served, then v2 (adapter B). The engine then holds v1's adapter name loaded from B's
    folder (as anyone who reached the engine could leave it) when an admin rolls back to v1 through the
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
            v1 = (await policies.add_candidate(session, 1, a, parent_version=0, base_model=engine_model)).name
            await policies.add_candidate(session, 2, b, parent_version=1, base_model=engine_model)
        await lifecycle.publish(sessions, engine, 1, activate=True)
        await lifecycle.publish(sessions, engine, 2, activate=True)
        assert same(answer(engine_url, v1), weights_a)

        await engine.load(v1, b)  # other weights under v1's name
        assert same(answer(engine_url, v1), weights_b)
        with running_proxy([engine_url], own_database_url, tmp_path) as proxy:
            rolled_back = requests.post(f"{proxy}/policies/1/activate", timeout=120)
            assert rolled_back.status_code == 200, rolled_back.text
            assert same(answer(proxy, engine_model), weights_a)
            listed = {p["version"]: p["status"] for p in requests.get(f"{proxy}/policies").json()["data"]}
        assert listed == {0: "retired", 1: "active", 2: "retired"}
        assert (await engine.listed())[engine_url][v1] == a
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
        names = {}  # version -> the adapter name its row keeps
        async with sessions() as session, session.begin():
            for version in (1, 2, 3):
                names[version] = (await policies.add_candidate(
                    session, version, adapter_folder(tmp_path / f"v{version}"), parent_version=version - 1,
                    base_model="stub-model")).name
        await lifecycle.publish(sessions, engine, 1, activate=True)
        assert await drain.sweep(sessions, engine) == []  # v1 serves
        await lifecycle.publish(sessions, engine, 2)
        await lifecycle.activate(sessions, engine, 2)  # v1 stops serving: seen by the next sweep
        await lifecycle.publish(sessions, engine, 3)
        await lifecycle.retire(sessions, 3, drain=drain)  # a gate kept it out
        assert sorted(await drain.sweep(sessions, engine)) == sorted([names[1], names[3]])
        assert {names[1], names[3]}.isdisjoint(held(stub_url)) and names[2] in held(stub_url)

        # a rollback loads v1 again from its own folder, and the drain leaves what serves alone
        await lifecycle.activate(sessions, engine, 1)
        assert held(stub_url)[names[1]] == str(tmp_path / "v1")
        assert await drain.sweep(sessions, engine) == [names[2]]
    finally:
        for name in names.values():
            await engine.unload(name)
        await store.dispose()


def test_two_deployments_sharing_one_engine_keep_to_their_own_adapters(postgres_server, own_database_url,
                                                                         tmp_path):
    """Two deployments, each with its own database, use one engine (two teams on one GPU server, a test run
    beside a running demo). Both have a version 1, but each loads it under a name of its own: each publishes
    its v1 from its own folder, then runs its restore pass (what each proxy runs every few seconds:
    `ensure_loaded` loads a serving version again unless the engine holds it from its own folder, and
    verifies it). The engine holds both versions, each loaded once from its own folder, and neither
    deployment touches the other's. When both were `rlproxy-v1`, the second publish replaced the first's and
    each restore pass loaded its own weights over the other's: agents got the other's weights, and under
    that churn vLLM crashed."""
    stub = Stub(BASE_MODEL)  # in this process: what it received can be read back

    def adapter_requests() -> list[tuple[str, str, str | None]]:
        """(route, adapter name, folder) of each load and unload the engine received."""
        return [(path, body["lora_name"], body.get("lora_path"))
                for path, raw in stub.bodies if path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")
                for body in [json.loads(raw)]]

    async def two_deployments(engine_url: str, database_urls: dict[str, str]) -> None:
        engine = EngineAdapters([engine_url])
        deployments = {deployment: open_database(url) for deployment, url in database_urls.items()}
        try:
            names, folders = {}, {}  # deployment -> its v1's adapter name (as its row keeps it), folder
            for deployment, store in deployments.items():
                sessions = session_factory(store)
                folders[deployment] = adapter_folder(tmp_path / deployment)
                async with sessions() as session, session.begin():
                    names[deployment] = (await policies.add_candidate(
                        session, 1, folders[deployment], parent_version=0, base_model=BASE_MODEL)).name
                await lifecycle.publish(sessions, engine, 1, activate=True)
            held = (await engine.listed())[engine_url]
            assert held[names["ours"]] == folders["ours"] and held[names["theirs"]] == folders["theirs"]
            assert [(name, folder) for route, name, folder in adapter_requests()
                    if route == "/v1/load_lora_adapter"] == [(names["ours"], folders["ours"]),
                                                             (names["theirs"], folders["theirs"])]

            stub.bodies.clear()
            for _ in range(2):  # each deployment's restore pass, in turn, twice
                for store in deployments.values():
                    await lifecycle.ensure_loaded(session_factory(store), engine, 1)
            assert adapter_requests() == []  # each found its own copy in place: nothing loaded or unloaded
            assert (await engine.listed())[engine_url] == held
            for store in deployments.values():
                async with session_factory(store)() as session:
                    assert (await replicas.states(session, 1))[engine_url].state == replicas.VERIFIED

            # The engine restarts (it forgets its adapters): each deployment's restore pass puts back its own.
            for name in names.values():
                await engine.unload(name)
            stub.bodies.clear()
            for store in deployments.values():
                await lifecycle.ensure_loaded(session_factory(store), engine, 1)
            assert adapter_requests() == [("/v1/load_lora_adapter", names["ours"], folders["ours"]),
                                          ("/v1/load_lora_adapter", names["theirs"], folders["theirs"])]
            assert (await engine.listed())[engine_url] == held
        finally:
            for store in deployments.values():
                await store.dispose()

    with engine_in_thread(stub) as engine_url, fresh_database(postgres_server) as their_database_url:
        asyncio.run(two_deployments(engine_url, {"ours": own_database_url, "theirs": their_database_url}))
