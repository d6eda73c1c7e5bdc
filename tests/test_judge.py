"""Judge rewards: rollouts that never get a posted reward are scored by an LLM judge comparing the trajectories
of their task group. The pure parts (the prompt, the reply's contract, judge+posted) first; then the real
proxy in front of the stub engine records episodes nobody rewards, and the trainer's judge job scores them
with a stand-in judge (testkit/judge_standin.py) whose hidden rubric the scores must follow."""
from __future__ import annotations

import asyncio
import json
import re
from contextlib import contextmanager
from datetime import timedelta

import openai
import pytest
import requests
from sqlalchemy import select

from core.settings import TrainerSettings, TrainingSettings
from rewards.judge import (
    JudgeOutputError,
    RecordedCall,
    combined_reward,
    judge_messages,
    parse_scores,
    trajectory_text,
)
from store import training
from store.db import open_database, session_factory
from store.judging import IdleRollout
from store.models import Call, utcnow
from tests.support import PYTHON, free_port, running, running_proxy
from trainer.judge import JudgeJob, ready_groups
from trainer.metrics import TrainerMetrics

MARKER = "SOLVED"

# --- the reply's contract ---------------------------------------------------------------------------------


def test_a_good_reply_gives_each_trajectory_its_score_as_given():
    reply = json.dumps({"scores": [{"id": "1", "score": 0.9, "explanation": "right"}, {"id": 2, "score": 0}]})
    scores = parse_scores(reply, ["1", "2"])
    assert {k: s.value for k, s in scores.items()} == {"1": 0.9, "2": 0.0}  # raw: no min-max within the group
    assert scores["1"].explanation == "right"


def test_the_json_is_the_whole_reply_or_one_fence_that_is():
    """Nothing may come before or after the verdict: a reply that quotes a trajectory's JSON (or the judge's own
    draft) and then gives its own is refused rather than read by guessing which block is the verdict."""
    fenced = '\n```json\n{"scores": [{"id": "1", "score": 1}]}\n```\n'
    bare = ' {"scores": [{"id": "1", "score": 0.5}]}\n'
    assert parse_scores(fenced, ["1"])["1"].value == 1.0
    assert parse_scores(bare, ["1"])["1"].value == 0.5
    for extra in ('Here you go:\n```json\n{"scores": [{"id": "1", "score": 1}]}\n```',
                  '```json\n{"scores": [{"id": "1", "score": 1}]}\n```\nDone.',
                  'My verdict: {"scores": [{"id": "1", "score": 0.5}]}'):
        with pytest.raises(JudgeOutputError):
            parse_scores(extra, ["1"])


@pytest.mark.parametrize("reply, complaint", [
    ("They all look fine.", "not one JSON object"),
    ('{"scores": [{"id": "1", "score": 1}', "not valid JSON"),  # a reply cut off by max_tokens
    ('{"verdicts": []}', 'no "scores" list'),
    ('{"scores": [{"id": "1", "score": 1}]}', "missing ['2']"),
    ('{"scores": [{"id": "1", "score": 1}, {"id": "2", "score": 0}, {"id": "3", "score": 0}]}', "unknown ['3']"),
    ('{"scores": [{"id": "1", "score": 1.5}, {"id": "2", "score": 0}]}', "outside [0, 1]"),
    ('{"scores": [{"id": "1", "score": "high"}, {"id": "2", "score": 0}]}', "not a number"),
    ('{"scores": [{"id": "1", "score": 1}, {"id": "1", "score": 0}]}', "scored twice"),
])
def test_a_reply_that_breaks_the_contract_is_refused_with_the_reason(reply, complaint):
    with pytest.raises(JudgeOutputError, match=re.escape(complaint)):
        parse_scores(reply, ["1", "2"])


def test_judge_plus_posted_weighs_the_two():
    assert combined_reward(1.0, 0.0) == 0.5
    assert combined_reward(1.0, 0.0, weight=0.75) == 0.75
    with pytest.raises(ValueError):
        combined_reward(1.0, 0.0, weight=2)


# --- the prompt ---------------------------------------------------------------------------------------------


def test_a_trajectory_shows_each_turn_once_whatever_the_route():
    first = RecordedCall("chat", {"messages": [{"role": "user", "content": "2+2?"}]},
                         {"choices": [{"message": {"role": "assistant", "content": "Let me think."}}]})
    second = RecordedCall("chat", {"messages": [{"role": "user", "content": "2+2?"},
                                                {"role": "assistant", "content": "Let me think."},
                                                {"role": "user", "content": "Well?"}]},
                          {"choices": [{"message": {"role": "assistant", "content": "4"}}]})
    assert trajectory_text([first, second]) == "[user] 2+2?\n[assistant] Let me think.\n[user] Well?\n[assistant] 4"
    responses = RecordedCall("responses", {"instructions": "Be brief.", "input": "Capital of France?"},
                             {"output": [{"type": "message", "content": [{"type": "output_text", "text": "Paris"}]}]})
    assert trajectory_text([responses]) == "[system] Be brief.\n[user] Capital of France?\n[assistant] Paris"
    messages = RecordedCall("messages", {"system": "Use tools.", "messages": [{"role": "user", "content": "Weather?"}]},
                            {"content": [{"type": "tool_use", "name": "weather", "input": {"city": "Oslo"}}]})
    assert trajectory_text([messages]).endswith('[assistant] call weather({"city": "Oslo"})')


def test_the_request_numbers_the_trajectories_and_carries_the_rubric():
    messages = judge_messages("t1", ["[assistant] a", "[assistant] b"], rubric="Shorter is better.")
    user = messages[-1]["content"]
    assert '<trajectory id="1">\n[assistant] a\n</trajectory>' in user and '<trajectory id="2">' in user
    assert "Shorter is better." in user and 'Task: "t1"' in user
    assert '"scores"' in messages[0]["content"]


def test_groups_are_judged_full_or_once_they_waited():
    now = utcnow()

    def idle(rollout_id, task, seconds_ago):
        return IdleRollout(rollout_id, task, now - timedelta(seconds=seconds_ago))

    rollouts = [idle("a1", "a", 5), idle("a2", "a", 4), idle("a3", "a", 3), idle("b1", "b", 5), idle("c1", "c", 90),
                idle("x", None, 1)]
    groups = ready_groups(rollouts, group_size=2, group_timeout_s=60, now=now)
    assert [[r.id for r in g] for g in groups] == [["c1"], ["a1", "a2"], ["x"]]  # oldest first; a3, b1 wait


# --- end to end -----------------------------------------------------------------------------------------------


@contextmanager
def judge_standin(tmp_path, *args: str):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [PYTHON, "-m", "testkit.judge_standin", "--port", str(port), "--marker", MARKER, *args]
    with running(command, url + "/v1/models", log_path=tmp_path / "judge.log"):
        yield url


def episode(proxy: str, task_id: str, answer: str, reward: float | None = None) -> str:
    """An agent's episode of two calls through the proxy, rewarded only if `reward` is given."""
    rollout = requests.post(f"{proxy}/rollouts", json={"task_id": task_id}).json()
    agent = openai.OpenAI(base_url=rollout["base_url"], api_key="unused", max_retries=0)
    history = [{"role": "user", "content": f"Solve task {task_id}."}]
    thought = agent.chat.completions.create(model="stub-model", messages=history, extra_body={"stub_reply": "Hmm"})
    history += [{"role": "assistant", "content": thought.choices[0].message.content},
                {"role": "user", "content": "Your final answer?"}]
    agent.chat.completions.create(model="stub-model", messages=history, extra_body={"stub_reply": answer})
    if reward is not None:
        assert requests.post(f"{proxy}/reward", json={"rollout_id": rollout["rollout_id"], "reward": reward}).ok
    assert requests.get(f"{proxy}/rollouts/{rollout['rollout_id']}").ok  # (its calls are in the store now)
    return rollout["rollout_id"]


async def run_judge(database_url: str, judge: str, engine: str, wait: bool = True, **settings):
    """One run of the trainer's judge job, as `rlproxy train --reward judge` runs it between steps."""
    settings = {"reward": "judge", "judge_idle_s": 0.2, **settings}
    if wait:
        await asyncio.sleep(settings["judge_idle_s"] + 0.1)
    metrics = TrainerMetrics()
    engine_ = open_database(database_url)
    try:
        config = TrainerSettings(database_url=database_url, upstreams=(engine,), judge_url=f"{judge}/v1", **settings)
        job = JudgeJob(config, session_factory(engine_), metrics, group_size=3, group_timeout_s=0)
        await job.run_once()
        await job.run_once()  # a second run finds nothing new to ask
        async with session_factory(engine_)() as session:
            ready = await training.ready_rollouts(session, limit=16, group_size=100, group_timeout_s=0)
    finally:
        await engine_.dispose()
    return metrics, ready


def judged(metrics: TrainerMetrics, outcome: str) -> float:
    return metrics.registry.get_sample_value("rlproxy_trainer_judge_groups_total", {"outcome": outcome}) or 0.0


async def test_unrewarded_episodes_get_the_judges_scores_and_become_trainable(stub_url, own_database_url, tmp_path):
    with running_proxy([stub_url], own_database_url, tmp_path) as proxy, judge_standin(tmp_path) as judge:
        solved = [episode(proxy, "t1", f"The answer is 4 {MARKER}") for _ in range(2)]
        failed = episode(proxy, "t1", "The answer is 5")
        posted = episode(proxy, "t1", "The answer is 5", reward=0.25)
        metrics, ready = await run_judge(own_database_url, judge, stub_url)
        rollouts = {i: requests.get(f"{proxy}/rollouts/{i}").json() for i in [*solved, failed, posted]}
        stats = requests.get(f"{judge}/stats").json()

    assert [rollouts[i]["reward"] for i in [*solved, failed]] == [1.0, 1.0, 0.0]  # the hidden rubric's verdict
    for rollout_id in [*solved, failed]:
        final = rollouts[rollout_id]["rewards"][-1]
        assert rollouts[rollout_id]["status"] == "finished"
        assert final["reason"] == "judge" and final["metadata"]["source"] == "judge"
        assert final["metadata"]["judge_model"] == "judge-standin" and final["metadata"]["explanation"]
    assert rollouts[posted]["reward"] == 0.25 and len(rollouts[posted]["rewards"]) == 1  # posted wins, not judged
    assert stats == {"requests": 1, "trajectories": ["1", "2", "3"]}  # one group of three, asked once
    assert judged(metrics, "judged") == 1.0
    assert set(ready) == {*solved, failed, posted}  # the trainer claims them like posted ones


async def test_the_judge_is_asked_as_its_base_model_when_it_lists_adapters_first(stub_url, own_database_url,
                                                                                  tmp_path):
    with (running_proxy([stub_url], own_database_url, tmp_path) as proxy,
          judge_standin(tmp_path, "--adapter", "judge-lora") as judge):
        rollout_id = episode(proxy, "t6", MARKER)
        metrics, _ = await run_judge(own_database_url, judge, stub_url)
        rollout = requests.get(f"{proxy}/rollouts/{rollout_id}").json()
    assert judged(metrics, "judged") == 1.0
    assert rollout["rewards"][-1]["metadata"]["judge_model"] == "judge-standin"  # not the adapter listed first


async def test_a_bad_reply_is_retried_until_a_good_one(stub_url, own_database_url, tmp_path):
    with (running_proxy([stub_url], own_database_url, tmp_path) as proxy,
          judge_standin(tmp_path, "--bad", "2", "--bad-kind", "count") as judge):
        ids = [episode(proxy, "t2", answer) for answer in (MARKER, "no", MARKER)]
        metrics, _ = await run_judge(own_database_url, judge, stub_url, judge_attempts=3)
        rewards = [requests.get(f"{proxy}/rollouts/{i}").json()["reward"] for i in ids]
        stats = requests.get(f"{judge}/stats").json()
    assert rewards == [1.0, 0.0, 1.0]
    assert stats["requests"] == 3 and judged(metrics, "judged") == 1.0
    # every request to the judge is on record, outside any rollout and policy: never claimed, never trained
    engine_ = open_database(own_database_url)
    async with session_factory(engine_)() as session:
        kept = (await session.execute(select(Call.agent, Call.rollout_id, Call.policy, Call.policy_version, Call.model)
                                      .where(Call.agent == "rlproxy-judge"))).all()
    await engine_.dispose()
    assert kept == [("rlproxy-judge", None, None, None, "judge-standin")] * 3


@pytest.mark.parametrize("bad_kind", ["range", "not-json"])  # not-json: a 200 whose body is an HTML page
async def test_a_judge_that_never_keeps_the_contract_leaves_the_group_unjudged(stub_url, own_database_url, tmp_path,
                                                                               bad_kind):
    with (running_proxy([stub_url], own_database_url, tmp_path) as proxy,
          judge_standin(tmp_path, "--bad", "-1", "--bad-kind", bad_kind) as judge):
        ids = [episode(proxy, "t3", MARKER) for _ in range(3)]
        metrics, ready = await run_judge(own_database_url, judge, stub_url, judge_attempts=2)
        rollouts = [requests.get(f"{proxy}/rollouts/{i}").json() for i in ids]
        stats = requests.get(f"{judge}/stats").json()
    assert [(r["status"], r["reward"]) for r in rollouts] == [("open", None)] * 3  # no score made up: they expire
    assert stats["requests"] == 2  # judge_attempts, and the second run did not ask again
    assert judged(metrics, "bad_output") == 1.0 and judged(metrics, "judged") == 0.0
    assert ready == []


async def test_judge_plus_posted_weighs_the_judge_with_the_posted_reward(stub_url, own_database_url, tmp_path):
    with running_proxy([stub_url], own_database_url, tmp_path) as proxy, judge_standin(tmp_path) as judge:
        posted_wrong = episode(proxy, "t4", "The answer is 5", reward=1.0)  # the agent's own check was too kind
        posted_right = episode(proxy, "t4", MARKER, reward=1.0)
        unposted = episode(proxy, "t4", MARKER)
        _, ready = await run_judge(own_database_url, judge, stub_url, reward="judge+posted", judge_weight=0.5)
        rollouts = {i: requests.get(f"{proxy}/rollouts/{i}").json() for i in (posted_wrong, posted_right, unposted)}
    assert [rollouts[i]["reward"] for i in (posted_wrong, posted_right, unposted)] == [0.5, 1.0, 1.0]
    weighed = rollouts[posted_wrong]["rewards"][-1]["metadata"]
    assert (weighed["posted"], weighed["combined"], weighed["source"]) == (1.0, 0.5, "judge")
    assert set(ready) == {posted_wrong, posted_right, unposted}  # released to the trainer once weighed


async def test_a_rollout_whose_agent_is_still_at_work_is_not_closed_by_the_judge(stub_url, own_database_url, tmp_path):
    """Silence, not the last call's age, makes a rollout ready: a reward the agent posts for one of its calls
    (or that one of its spans carries) while it works on is a sign of life."""
    with running_proxy([stub_url], own_database_url, tmp_path) as proxy, judge_standin(tmp_path) as judge:
        ids = [episode(proxy, "t5", MARKER) for _ in range(3)]
        await asyncio.sleep(3.1)  # every last call is older than judge_idle_s (3 s) now
        working = ids[0]
        first_call = requests.get(f"{proxy}/rollouts/{working}").json()["calls"][0]["call_id"]
        assert requests.post(f"{proxy}/reward", json={"rollout_id": working, "call_id": first_call,
                                                      "reward": 0.5}).ok
        metrics, _ = await run_judge(own_database_url, judge, stub_url, wait=False, judge_idle_s=3)
        status = [requests.get(f"{proxy}/rollouts/{i}").json()["status"] for i in ids]
    assert status == ["open", "finished", "finished"]  # the two silent ones were judged as a group
    assert judged(metrics, "judged") == 1.0


async def test_under_judge_plus_posted_the_trainer_never_claims_a_posted_rollout_before_the_judge(
        stub_url, own_database_url, tmp_path):
    """The trainer's claim waits for the judge's word on every posted rollout, however soon after the reward it
    looks; once the judge has scored the group, or given up on it, the group is claimed."""
    from trainer.worker import TrainerWorker

    def trainer(judge_url: str) -> TrainerWorker:
        settings = TrainerSettings(database_url=own_database_url, upstreams=(stub_url,), metrics_port=None,
                                   reward="judge+posted", judge_url=judge_url,
                                   training=TrainingSettings(group_size=2, group_timeout_s=0, batch_timeout_s=0))
        return TrainerWorker(settings, tmp_path)

    async def claim(judge_url: str) -> set[str]:
        worker = trainer(judge_url)
        try:
            return set(await worker._claim())
        finally:
            await worker.database.dispose()

    with running_proxy([stub_url], own_database_url, tmp_path) as proxy, judge_standin(tmp_path) as judge:
        weighed = [episode(proxy, "t6", answer, reward=1.0) for answer in (MARKER, "The answer is 5")]
        assert await claim(f"{judge}/v1") == set()  # posted, not judged yet: the judge has not run since
        await run_judge(own_database_url, judge, stub_url, reward="judge+posted")
        assert await claim(f"{judge}/v1") == set(weighed)

        dead_judge = f"http://127.0.0.1:{free_port()}"
        unweighed = [episode(proxy, "t7", MARKER, reward=1.0) for _ in range(2)]
        assert await claim(f"{dead_judge}/v1") == set()
        metrics, _ = await run_judge(own_database_url, dead_judge, stub_url, reward="judge+posted", judge_attempts=1)
        assert judged(metrics, "unreachable") == 1.0
        assert await claim(f"{dead_judge}/v1") == set(unweighed)  # released: trained on the posted reward alone
        kept = requests.get(f"{proxy}/rollouts/{unweighed[0]}").json()
    finals = [r for r in kept["rewards"] if r["kind"] == "final"]
    assert [(r["reason"], r["value"]) for r in finals] == [(None, 1.0), ("judge_unscored", 1.0)]
    assert kept["reward"] == 1.0 and finals[-1]["metadata"]["why"].startswith("unreachable")


def test_the_trainer_refuses_to_start_with_a_judge_it_cannot_use():
    """Usage errors (exit status 2) before anything starts: no judge named (the base model judges at chance), or a
    judge that could only read the marker redacted text is stored as."""
    from click.testing import CliRunner

    from rlproxy.cli import main

    result = CliRunner().invoke(main, ["train", "--upstream", "http://127.0.0.1:9", "--reward", "judge"])
    assert result.exit_code == 2 and "--reward judge needs --judge-url" in result.output
    args = ["train", "--upstream", "http://127.0.0.1:9", "--judge-url", "http://127.0.0.1:9/v1"]
    for reward in ("judge", "judge+posted"):
        result = CliRunner().invoke(main, [*args, "--reward", reward, "--redact-content"])
        assert result.exit_code == 2, result.output
        assert f"--reward {reward} cannot be used with --redact-content" in result.output
    # one RLPROXY_REDACT_CONTENT for every process (as the Helm chart sets it) says it to the trainer too
    result = CliRunner().invoke(main, [*args, "--reward", "judge"], env={"RLPROXY_REDACT_CONTENT": "true"})
    assert result.exit_code == 2 and "--redact-content" in result.output


def test_a_trajectory_of_redacted_text_is_recognised_as_unreadable():
    from rewards.judge import only_redacted

    redacted = RecordedCall("chat", {"messages": [{"role": "user", "content": "[redacted]"}]},
                            {"choices": [{"message": {"role": "assistant", "content": "[redacted]", "tool_calls": [
                                {"function": {"name": "calc", "arguments": "{}"}}]}}]})
    assert only_redacted(trajectory_text([redacted]))
    readable = RecordedCall("chat", {"messages": [{"role": "user", "content": "2+2?"}]},
                            {"choices": [{"message": {"role": "assistant", "content": "[redacted]"}}]})
    assert not only_redacted(trajectory_text([readable]))
