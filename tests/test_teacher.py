"""A URL teacher (trainer/teacher.py): refused at start unless it tokenizes as the trainer's model does; it scores the
student's exact ids by prompt log-probs; the teacher context reaches the teacher only, never the agent or the
recorded call (the stand-in engine behind `rlproxy serve`, a real process each, and the store)."""
from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest
import requests

from core.settings import TrainingSettings
from core.settings.teacher import Teacher, Teachers
from store.db import open_database, session_factory
from store.training import load_call_texts, load_rollouts
from testkit.stub_engine import render_chat, stub_logprob, tokenize
from trainer.distill import Distiller, policy_transitions
from trainer.teacher import Sequence, TeacherEngine, TeacherRefused
from trainer.transitions import SkipReasons

HINT = "TEACHER-ONLY-HINT worked example: 5 times 8 is 40"


class StandInTokenizer:
    """The stand-in engine's tokenizer and chat template, as a trainer's tokenizer offers them."""

    def __init__(self, template=render_chat) -> None:
        self.template = template

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": tokenize(text)}

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=True, tokenize=True, return_dict=False):
        from testkit.stub_engine import tokenize as ids_of

        return ids_of(self.template(messages))


def contains(ids: list[int], part: list[int]) -> bool:
    return any(ids[i:i + len(part)] == part for i in range(len(ids) - len(part) + 1))


def check(url: str, tokenizer) -> None:
    asyncio.run(TeacherEngine(url, Teachers(teacher=(url,))).check(tokenizer))


def test_a_teacher_with_another_tokenizer_is_refused_with_what_differs(stub_url):
    pytest.importorskip("transformers")
    import transformers
    from engine.model import prepare_model

    bundled = transformers.AutoTokenizer.from_pretrained(str(prepare_model()))
    with pytest.raises(TeacherRefused, match="tokenizes a probe text otherwise than the trainer's model"):
        check(stub_url, bundled)
    # the same vocabulary but another chat template is refused too: the teacher would read other prompts
    with pytest.raises(TeacherRefused, match="a chat \\(its chat template\\)"):
        check(stub_url, StandInTokenizer(template=lambda messages: "plain " + render_chat(messages)))
    check(stub_url, StandInTokenizer())  # the stand-in's own: accepted


def test_a_teacher_that_cannot_be_checked_is_refused(stub_url):
    with pytest.raises(TeacherRefused, match="cannot be reached"):
        check("http://127.0.0.1:9", StandInTokenizer())
    with pytest.raises(TeacherRefused, match="does not serve 'other-model'"):
        asyncio.run(TeacherEngine(stub_url, Teachers(teacher=(stub_url,)), model="other-model")
                    .check(StandInTokenizer()))


def test_the_url_teacher_scores_the_last_ids_and_counts_what_it_could_not(stub_url):
    settings = Teachers(teacher=(stub_url,), teacher_step_tokens=10, teacher_attempts=2, teacher_timeout_s=5)
    engine = TeacherEngine(stub_url, settings, model="stub-model", max_model_len=8)
    skipped = Counter()
    scores = asyncio.run(engine.score([Sequence([1, 2, 3, 4, 5], 2), Sequence([7] * 8, 3),  # past max_model_len
                                       Sequence([6, 7, 8, 9, 10, 11], 1)], skipped))  # past the step's 10 tokens
    assert scores == [[stub_logprob(4), stub_logprob(5)], None, None]
    assert skipped == {"teacher_too_long": 1, "teacher_budget": 1}
    down = TeacherEngine("http://127.0.0.1:9", settings)
    assert asyncio.run(down.score([Sequence([1, 2], 1)], skipped)) == [None]
    assert skipped["teacher_unscored"] == 1 and down.requests == 2  # tried teacher_attempts times, then counted


def test_the_teacher_context_reaches_the_teacher_only(proxy_url, stub_url, database_url):
    rollout = requests.post(f"{proxy_url}/rollouts", json={"task_id": "hint"}).json()
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 6 times 7?"}]
    answer = requests.post(f"{rollout['base_url']}/chat/completions", timeout=30,
                           json={"model": "stub-model", "messages": messages}).json()
    assert requests.post(f"{proxy_url}/reward", json={"rollout_id": rollout["rollout_id"], "reward": 1.0}).ok

    async def teach():
        database = open_database(database_url)
        try:
            async with session_factory(database)() as session:
                rollouts = await load_rollouts(session, [rollout["rollout_id"]])
                skips = SkipReasons()
                transitions = policy_transitions(rollouts, TrainingSettings(), 0, skips, taught=True)
                before = await load_call_texts(session, [t.call_id for t in transitions])
                engine = TeacherEngine(stub_url, Teachers(teacher=(stub_url,)))
                await engine.check(StandInTokenizer())
                seen = []
                score = engine.score

                async def recording(sequences, skipped=None):
                    seen.extend(sequences)
                    return await score(sequences, skipped)

                engine.score = recording
                distiller = Distiller(Teacher("default", stub_url, HINT, "before_last_user"),
                                      Teachers(teacher=(stub_url,), teacher_clip=100), StandInTokenizer(), engine)
                kept, report = await distiller.teach(transitions, {c: r for c, (r, _) in before.items()}, None, skips)
                after = await load_call_texts(session, [t.call_id for t in transitions])
                return transitions, kept, report, seen, before, after
        finally:
            await database.dispose()

    transitions, kept, report, seen, before, after = asyncio.run(teach())
    (sent,) = seen
    completion = transitions[0].completion_ids
    assert sent.ids[-len(completion):] == completion  # the student's exact ids, after the teacher's own prompt
    assert contains(sent.ids, tokenize(HINT)) and not contains(transitions[0].prompt_ids, tokenize(HINT))
    assert report.scored == 1  # a lone rollout has no reward advantage: the gap is all there is
    assert kept[0].token_advantages == pytest.approx(
        [stub_logprob(i) - lp for i, lp in zip(completion, transitions[0].behaviour_logprobs)], abs=1e-6)
    assert after == before  # the recorded call is untouched
    stored = requests.get(f"{proxy_url}/rollouts/{rollout['rollout_id']}").json()
    for seen_by_others in (json.dumps(stored), json.dumps(answer), json.dumps(before)):
        assert "TEACHER-ONLY-HINT" not in seen_by_others
    assert stored["calls"][0]["prompt_token_ids"] == transitions[0].prompt_ids  # what the student was prompted with


def test_the_engine_as_teacher_is_accepted_and_scores_what_it_sampled(engine_url, engine_model):
    """The URL form against vLLM serving the same base: checked, then its prompt log-probs of a completion it sampled
    are that completion's sampling log-probs (the same weights, temperature 1). One request at a time: vLLM 0.32 on
    CPU with LoRA dies on prompt log-prob requests batched together (docs/distillation.md)."""
    import transformers
    from engine.model import prepare_model

    engine = TeacherEngine(engine_url, Teachers(teacher=(engine_url,)))
    asyncio.run(engine.check(transformers.AutoTokenizer.from_pretrained(str(prepare_model()))))
    assert engine.model == engine_model and engine.max_model_len
    sampled = requests.post(f"{engine_url}/v1/chat/completions", timeout=120, json={
        "model": engine_model, "messages": [{"role": "user", "content": "What is 6*7?"}], "max_tokens": 8,
        "temperature": 1.0, "logprobs": True, "return_token_ids": True}).json()
    completion = sampled["choices"][0]["token_ids"]
    [scores] = asyncio.run(engine.score([Sequence(sampled["prompt_token_ids"] + completion, len(completion))]))
    recorded = [entry["logprob"] for entry in sampled["choices"][0]["logprobs"]["content"]]
    # float32 engine: 3e-5 apart (measured); a bf16 one differs between prefill and decode numerics, while a
    # position off by one would be nats away
    assert scores == pytest.approx(recorded, abs=0.05)
