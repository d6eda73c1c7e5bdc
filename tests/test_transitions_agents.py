"""What the trainer trains from agents that do not behave like the demo: `rlproxy serve` in front of the stand-in
engine, recording into Postgres, then the trainer's own selection (store.training.load_rollouts,
trainer.batch.build_transitions) over what was stored, read token by token.

The guarantee, whatever the agent does to its history: every token trained was sampled by the engine for one call,
is trained once, with that call's own log-prob and the rollout's advantage, right after exactly the tokens the engine
was prompted with. Tokens the agent or the chat template added (tool results, an edited reply, the end-of-turn token
after a reply cut by max_tokens, a prefilled reply) are context only.
"""
from __future__ import annotations

import asyncio
import threading

import anthropic
import openai
import requests

from core.settings import TrainingSettings
from store.db import open_database, session_factory
from store.training import load_rollouts
from testkit.stub_engine import EOS_ID, render_chat, tokenize
from trainer.batch import build_transitions
from trainer.transitions import SkipReasons, Transition

SYSTEM = {"role": "system", "content": "You are terse."}
QUESTION = {"role": "user", "content": "What is 6 times 7?"}
TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]


def new_rollout(proxy_url: str, task_id: str) -> tuple[str, str]:
    response = requests.post(f"{proxy_url}/rollouts", json={"task_id": task_id})
    assert response.status_code == 201, response.text
    return response.json()["rollout_id"], response.json()["base_url"]


def chat(base_url: str, messages: list[dict], expect: int = 200, **fields) -> dict:
    response = requests.post(f"{base_url}/chat/completions",
                             json={"model": "stub-model", "messages": messages, **fields}, timeout=30)
    assert response.status_code == expect, response.text
    return response.json() if expect == 200 else {}


def reply(answer: dict, index: int = 0) -> dict:
    message = answer["choices"][index]["message"]
    return {key: message[key] for key in ("role", "content", "tool_calls") if message.get(key)}


def stored_calls(proxy_url: str, rollout_id: str) -> dict[str, dict]:
    response = requests.get(f"{proxy_url}/rollouts/{rollout_id}")
    assert response.status_code == 200, response.text
    return {call["call_id"]: call for call in response.json()["calls"]}


def transitions_of(database_url: str, rollout_ids: list[str], **settings) -> list[Transition]:
    async def load():
        database = open_database(database_url)
        try:
            async with session_factory(database)() as session:
                return await load_rollouts(session, rollout_ids)
        finally:
            await database.dispose()

    return build_transitions(asyncio.run(load()), TrainingSettings(**settings), 0, SkipReasons())


def trained_spans(transition: Transition, calls: dict[str, dict]) -> list[tuple[str, list, list, list, set]]:
    """(call id, the tokens before its span, its trained tokens, their log-probs, their advantages) for each call
    a transition trains, in order: its trained tokens are its calls' sampled tokens one after the other."""
    sequence = transition.prompt_ids + transition.completion_ids
    base = len(transition.prompt_ids)
    trained = [base + i for i, keep in enumerate(transition.mask()) if keep]
    spans = []
    for call_id in transition.call_ids:
        length = len(chosen_tokens(calls[call_id], transition, base))
        where, trained = trained[:length], trained[length:]
        assert where == list(range(where[0], where[0] + length)), "a call's sampled tokens are one run"
        spans.append((call_id, sequence[:where[0]], [sequence[p] for p in where],
                      [transition.behaviour_logprobs[p - base] for p in where],
                      {transition.advantages()[p - base] for p in where}))
    assert trained == [], "every trained token belongs to one of the transition's calls"
    return spans


def chosen_tokens(call: dict, transition: Transition, base: int) -> list[int]:
    """The tokens of the choice the transition holds for `call` (the only one, or the continued one of several)."""
    held = transition.prompt_ids + transition.completion_ids
    for choice in sorted(call["choices"], key=lambda c: -len(c["token_ids"] or [])):
        tokens = choice["token_ids"] or []
        if any(held[i:i + len(tokens)] == tokens for i in range(base, len(held) - len(tokens) + 1)):
            return tokens
    raise AssertionError(f"none of call {call['call_id']}'s choices is in its transition")


def assert_trained_as_sampled(transitions: list[Transition], calls: dict[str, dict], advantage: float) -> list[str]:
    """Each trained call: after exactly its recorded prompt, its sampled tokens, with their log-probs, once."""
    seen = []
    for transition in transitions:
        for call_id, before, tokens, logprobs, advantages in trained_spans(transition, calls):
            call = calls[call_id]
            [choice] = [c for c in call["choices"] if c["token_ids"] == tokens]
            assert before == call["prompt_token_ids"], f"{call_id} trained after a prompt the engine did not see"
            assert logprobs == choice["logprobs"] and advantages == {advantage}
            seen.append(call_id)
    assert len(seen) == len(set(seen)), "a call trained twice"
    return seen


def engine_prompt(messages: list[dict]) -> list[int]:
    """The ids the stand-in engine prompts itself with for a chat request."""
    return tokenize(render_chat(messages))


def test_an_agent_that_rewrites_retries_and_gets_cut_short_trains_each_sampled_token_once(proxy_url, database_url):
    winner, base_url = new_rollout(proxy_url, "rewriting-agent")
    loser, loser_url = new_rollout(proxy_url, "rewriting-agent")
    chat(loser_url, [SYSTEM, QUESTION])

    history = [SYSTEM, QUESTION]
    first = chat(base_url, history)
    history += [reply(first), {"role": "user", "content": "Show your work."}]
    chat(base_url, history, expect=503, stub_status=503)  # failed, then retried: the retry is the call
    second = chat(base_url, history)
    # cut by max_tokens: no end-of-turn token was sampled; the template's one in the next prompt is context
    history += [reply(second), {"role": "user", "content": "Shorter."}]
    cut = chat(base_url, history, max_tokens=2)
    assert cut["choices"][0]["finish_reason"] == "length"
    history += [reply(cut), {"role": "user", "content": "Go on."}]
    chat(base_url, history)
    # the agent rewrites its history: an earlier reply edited, the system prompt changed, old turns dropped
    rewritten = [{"role": "system", "content": "You are verbose."}, QUESTION,
                 {"role": "assistant", "content": "  " + reply(first)["content"].upper()},
                 {"role": "user", "content": "Again."}]
    chat(base_url, rewritten)
    # a reply that is only a tool call, then its result
    tool_turn = [SYSTEM, {"role": "user", "content": "use tool"}]
    asked = chat(base_url, tool_turn, tools=TOOLS)
    assert asked["choices"][0]["finish_reason"] == "tool_calls" and not asked["choices"][0]["message"]["content"]
    tool_id = asked["choices"][0]["message"]["tool_calls"][0]["id"]
    chat(base_url, tool_turn + [reply(asked), {"role": "tool", "tool_call_id": tool_id, "content": "42"}],
         tools=TOOLS)
    # a stream the engine died in the middle of, then the same request again
    dying = requests.post(f"{base_url}/chat/completions", json={
        "model": "stub-model", "messages": history, "stream": True, "stub_die_after": 2}, timeout=30)
    dying.close()
    chat(base_url, history, stream=False)
    for rollout_id, value in ((winner, 1.0), (loser, 0.0)):
        assert requests.post(f"{proxy_url}/reward", json={"rollout_id": rollout_id, "reward": value}).ok

    calls = stored_calls(proxy_url, winner)
    ok = [call_id for call_id, call in calls.items() if call["status"] == "ok"]
    assert len(ok) == 8 and len(calls) == 10  # the 503 and the broken stream are stored failed
    for call in calls.values():
        if call["status"] == "ok":
            assert call["prompt_token_ids"] == engine_prompt(call["request"]["messages"])
    assert calls[ok[2]]["completion_token_ids"][-1] != EOS_ID  # the cut reply

    transitions = [t for t in transitions_of(database_url, [winner, loser]) if t.rollout_id == winner]
    [advantage] = {t.advantage for t in transitions}
    assert advantage > 0
    assert sorted(assert_trained_as_sampled(transitions, calls, advantage)) == sorted(ok)
    merged = next(t for t in transitions if len(t.call_ids) > 1)
    assert merged.call_ids[:4] == ok[:4]  # the retry and the cut reply continue the conversation in one sequence


def test_two_conversations_at_once_in_one_rollout_are_trained_apart(proxy_url, database_url):
    """Parallel workers under one agent name: their calls interleave in the rollout; neither conversation's tokens
    are trained after the other's prompt."""
    rollout_id, base_url = new_rollout(proxy_url, None)
    histories = {name: [{"role": "user", "content": f"Task for worker {name}."}] for name in "ab"}
    barrier = threading.Barrier(2)

    def worker(name: str) -> None:
        for turn in range(3):
            barrier.wait()
            answer = chat(base_url, histories[name])
            histories[name] += [reply(answer), {"role": "user", "content": f"Turn {turn} done."}]

    threads = [threading.Thread(target=worker, args=(name,)) for name in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert requests.post(f"{proxy_url}/reward", json={"rollout_id": rollout_id, "reward": 1.0}).ok

    calls = stored_calls(proxy_url, rollout_id)
    transitions = transitions_of(database_url, [rollout_id], advantage_estimator="reinforce")
    assert sorted(assert_trained_as_sampled(transitions, calls, 1.0)) == sorted(calls)


def test_a_choice_among_several_and_a_prefilled_reply_train_only_what_was_sampled(proxy_url, database_url):
    rollout_id, base_url = new_rollout(proxy_url, None)
    several = chat(base_url, [QUESTION], n=3)
    went_on = reply(several, 2)
    chat(base_url, [QUESTION, went_on, {"role": "user", "content": "Why?"}])
    # Messages with a prefill: the prefill's tokens are prompt, only what follows was sampled
    client = anthropic.Anthropic(base_url=base_url.removesuffix("/v1"), api_key="unused")
    client.messages.create(model="stub-model", max_tokens=16, messages=[
        {"role": "user", "content": "Name a color."}, {"role": "assistant", "content": "Sure here"}])
    # Responses, continued by previous_response_id
    responses = openai.OpenAI(base_url=base_url, api_key="unused").responses
    asked = responses.create(model="stub-model", input="first")
    responses.create(model="stub-model", input="second", previous_response_id=asked.id)
    assert requests.post(f"{proxy_url}/reward", json={"rollout_id": rollout_id, "reward": 1.0}).ok

    calls = stored_calls(proxy_url, rollout_id)
    transitions = transitions_of(database_url, [rollout_id], advantage_estimator="reinforce")
    trained = assert_trained_as_sampled(transitions, calls, 1.0)
    assert sorted(trained) == sorted(calls)  # every call, the three-choice one by the choice continued
    pick = next(t for t in transitions if t.call_ids[0] == list(calls)[0])
    held = pick.completion_ids[:len(calls[pick.call_ids[0]]["choices"][2]["token_ids"])]
    assert held == calls[pick.call_ids[0]]["choices"][2]["token_ids"]
