"""Nothing is trained that was not answered as recorded: `rlproxy serve` (a real process) in front of the stand-in
engine, recording into real Postgres, then the trainer's own selection (store.training.load_rollouts and
trainer.batch.build_transitions) over what was stored.

- a completions request with several prompts is refused (one recorded call holds one prompt's ids);
- a call whose answer to the agent was an error (the engine's 503, an error event inside the stream, a stream the
  engine ended without [DONE], the spool unable to keep it) is stored failed, and yields no transition;
- `/readyz` says when the spool cannot be written, and a small volume does not fill with calls already stored.
"""
from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import openai
import pytest
import requests

from core.settings import TrainingSettings
from store.db import open_database, session_factory
from store.training import load_rollouts
from tests.support import PYTHON, free_port, proxy_command, running
from trainer.batch import build_transitions
from trainer.transitions import SkipReasons

MESSAGES = [{"role": "user", "content": "What is 6 times 7?"}]


def new_rollout(proxy_url: str) -> tuple[str, str]:
    response = requests.post(f"{proxy_url}/rollouts", json={"task_id": "answered"})
    assert response.status_code == 201, response.text
    return response.json()["rollout_id"], response.json()["base_url"]


def reward(proxy_url: str, rollout_id: str) -> None:
    response = requests.post(f"{proxy_url}/reward", json={"rollout_id": rollout_id, "reward": 1.0})
    assert response.status_code == 200, response.text


def stored(proxy_url: str, rollout_id: str) -> dict[str, str]:
    """call id -> status, as the proxy stored them."""
    response = requests.get(f"{proxy_url}/rollouts/{rollout_id}")
    assert response.status_code == 200, response.text
    return {call["call_id"]: call["status"] for call in response.json()["calls"]}


def trained_call_ids(database_url: str, rollout_id: str, **settings) -> list[str]:
    """The calls the trainer would train on, from its own selection over the stored rollout."""
    async def load():
        database = open_database(database_url)
        try:
            async with session_factory(database)() as session:
                return await load_rollouts(session, [rollout_id])
        finally:
            await database.dispose()

    config = TrainingSettings(max_seq_len=1 << 20, **settings)  # the spool test's calls are long
    transitions = build_transitions(asyncio.run(load()), config, 0, SkipReasons(), keep_zero=True)
    return [call_id for transition in transitions for call_id in transition.call_ids]


def stream_events(response: requests.Response) -> list[str]:
    return [line[len("data: "):] for line in response.iter_lines(decode_unicode=True) if line.startswith("data: ")]


# --- several prompts in one completions request ------------------------------------------------------------------

@pytest.mark.parametrize("prompt", [["What is 6 times 7?", "Name a color."], [[101, 102], [103, 104]]],
                         ids=["texts", "token-id-lists"])
def test_a_completion_with_several_prompts_is_refused_naming_the_prompt(proxy_url, prompt):
    _, base_url = new_rollout(proxy_url)
    response = requests.post(f"{base_url}/completions", json={"model": "stub-model", "prompt": prompt})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "prompt" and error["type"] == "invalid_request_error"
    assert "one prompt per call" in error["message"] and "2" in error["message"]


def test_one_prompt_in_any_form_is_served_and_each_choice_continues_it(proxy_url, database_url):
    rollout_id, base_url = new_rollout(proxy_url)
    client = openai.OpenAI(base_url=base_url, api_key="unused")
    for prompt in ("What is 6 times 7?", ["What is 6 times 7?"], [101, 102, 103], [[101, 102, 103]]):
        completion = client.completions.create(model="stub-model", prompt=prompt, n=2, max_tokens=8)
        assert [choice.index for choice in completion.choices] == [0, 1]
    reward(proxy_url, rollout_id)
    calls = stored(proxy_url, rollout_id)
    assert list(calls.values()) == ["ok"] * 4
    # Each choice is a continuation of its prompt; which one earned the reward no later call says (tests/
    # test_choices_trained.py), so they are trained only where the operator says the outcome rests on all.
    assert sorted(trained_call_ids(database_url, rollout_id, choices_trained="all")) == sorted(
        [c for c in calls for _ in range(2)])
    assert trained_call_ids(database_url, rollout_id) == []


# --- answers that were errors ----------------------------------------------------------------------------------

def test_calls_answered_with_an_engine_error_are_stored_failed_and_never_trained(proxy_url, database_url):
    rollout_id, base_url = new_rollout(proxy_url)
    chat = f"{base_url}/chat/completions"
    good = requests.post(chat, json={"model": "stub-model", "messages": MESSAGES})
    assert good.status_code == 200

    relayed_503 = requests.post(chat, json={"model": "stub-model", "messages": MESSAGES, "stub_status": 503})
    assert relayed_503.status_code == 503 and "error" in relayed_503.json()

    with requests.post(chat, json={"model": "stub-model", "messages": MESSAGES, "stream": True,
                                   "stub_error_after": 2}, stream=True) as failed_stream:
        events = stream_events(failed_stream)
    assert "error" in json.loads(events[-2]) and events[-1] == "[DONE]"

    cut = {}
    for route, body in (("chat/completions", {"messages": MESSAGES}), ("completions", {"prompt": "Say hi"})):
        with requests.post(f"{base_url}/{route}", json={"model": "stub-model", "stream": True, "stub_end_after": 2,
                                                        **body}, stream=True) as cut_stream:
            events = stream_events(cut_stream)
            cut[route] = cut_stream.headers["X-Rlproxy-Call-Id"]
        # the engine closed the stream without [DONE]: the agent is told its answer ended early
        assert json.loads(events[-1])["error"]["message"] == "the engine ended the stream early"

    reward(proxy_url, rollout_id)
    calls = stored(proxy_url, rollout_id)
    good_id = good.headers["X-Rlproxy-Call-Id"]
    failed = [relayed_503.headers["X-Rlproxy-Call-Id"], failed_stream.headers["X-Rlproxy-Call-Id"], *cut.values()]
    assert calls == {good_id: "ok", **{call_id: "upstream_error" for call_id in failed}}
    assert trained_call_ids(database_url, rollout_id) == [good_id]


# --- a spool that cannot be written ----------------------------------------------------------------------------

FILE_LIMIT = 256 << 10  # no file the proxy writes may grow past this (RLIMIT_FSIZE): a full volume, in effect


def proxy_with_file_limit(port: int, stub_url: str, database_url: str, spool: Path) -> list[str]:
    """`rlproxy serve` whose files cannot grow past FILE_LIMIT: its writes past it fail with EFBIG, as on a full
    disk (Python ignores SIGXFSZ)."""
    serve = proxy_command(port, [stub_url], database_url, "--spool-path", str(spool))
    limit = (f"import os, resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, ({FILE_LIMIT}, {FILE_LIMIT})); "
             "os.execv(sys.argv[1], sys.argv[1:])")
    return [PYTHON, "-c", limit, *serve]


def wait_stored(proxy_url: str, rollout_id: str, count: int) -> None:
    deadline = time.monotonic() + 20
    while len(stored(proxy_url, rollout_id)) < count:
        assert time.monotonic() < deadline, "the calls were not stored in time"
        time.sleep(0.05)


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE as on Linux")
def test_a_spool_that_cannot_be_written_is_not_ready_and_its_calls_are_never_trained(stub_url, own_database_url,
                                                                                      tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = proxy_with_file_limit(port, stub_url, own_database_url, tmp_path / "spool.jsonl")
    with running(args, url + "/healthz", log_path=tmp_path / "proxy.log"):
        ready = requests.get(f"{url}/readyz")
        assert ready.status_code == 200 and ready.json()["spool"]["writable"] is True
        rollout_id, base_url = new_rollout(url)
        chat = f"{base_url}/chat/completions"

        # Calls of 100 KB each: the spool keeps every stored call in its active segment until the segment is
        # full (4 MiB by default), but when the disk refuses more it drops a segment whose calls are all stored.
        medium = [{"role": "user", "content": "pad " * 10_000}]  # with its prompt's ids, a 100 KB record
        kept = []
        for _ in range(5):
            answer = requests.post(chat, json={"model": "stub-model", "messages": medium})
            assert answer.status_code == 200, answer.text
            kept.append(answer.headers["X-Rlproxy-Call-Id"])
            wait_stored(url, rollout_id, len(kept))
            time.sleep(0.5)  # the writer retires a call from the spool just after its transaction ends

        # A call the spool cannot keep at all: the agent gets 503 (or an error event ending its stream).
        huge = [{"role": "user", "content": "pad " * 80_000}]
        refused = requests.post(chat, json={"model": "stub-model", "messages": huge})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "store_unavailable"
        with requests.post(chat, json={"model": "stub-model", "messages": huge, "stream": True},
                           stream=True) as streamed:
            events = stream_events(streamed)
        assert json.loads(events[-1])["error"]["code"] == "store_unavailable"

        not_ready = requests.get(f"{url}/readyz")
        assert not_ready.status_code == 503 and not_ready.json()["status"] == "unavailable"
        spool = not_ready.json()["spool"]
        assert spool["writable"] is False and "File too large" in spool["problem"]

        wait_stored(url, rollout_id, len(kept) + 2)
        reward(url, rollout_id)
        failed = [refused.headers["X-Rlproxy-Call-Id"], streamed.headers["X-Rlproxy-Call-Id"]]
        assert stored(url, rollout_id) == {**{c: "ok" for c in kept}, **{c: "store_error" for c in failed}}
        assert sorted(trained_call_ids(own_database_url, rollout_id)) == sorted(kept)


def test_a_segment_is_bounded_by_the_free_space_of_its_volume(tmp_path):
    from proxy.recording.spool import Spool
    from proxy.recording.space import free_bytes

    spool = Spool(tmp_path / "spool.jsonl", segment_bytes=1 << 50)  # more than any disk here
    spool.write_lines([b"{}\n"])
    [segment] = spool.segments
    assert segment.limit <= free_bytes(tmp_path) // 8 * 1.05  # (others write to the disk meanwhile)
    asyncio.run(spool.close())
