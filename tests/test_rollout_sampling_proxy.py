"""`rlproxy serve --rollout-sampling` changes only what it should: a training rollout's calls go upstream with the
operator's temperature, top_p or top_k on every wire format, everything else in their bodies as the agent sent it;
the call keeps the agent's own request and records what was changed; evaluation rollouts, calls without a rollout
and calls of another scope go upstream as the agent asked; and the trainer reads the sampling the engine got.
The sampling parameters vLLM refuses reach the agent as a 400 in its route's format, and the setting's own values
are checked when the proxy starts.

A real `rlproxy serve` against the stand-in engine in this process (testkit/stub_sampling.py: it refuses what vLLM
refuses, and keeps every body it receives), real Postgres."""
from __future__ import annotations

import asyncio
import json
import subprocess

import anthropic
import openai
import pytest
import requests

from store.db import open_database, session_factory
from store.training import load_rollouts
from core.sampling_rules import Sampled
from testkit.stub_sampling import SamplingStub
from trainer.sampled import sampled_with
from tests.support import PYTHON, fresh_database, running_proxy
from tests.tenants import engine_in_thread

RULES = ["agent:planner/temperature=0.8,top_p=0.95", "policy:coder/top_k=0", "temperature=1.0"]
CHANGED = {"rule": "temperature=1.0", "asked": {"temperature": 0}, "sent": {"temperature": 1.0}}
HI = [{"role": "user", "content": "hi"}]
# (this anthropic SDK has no sampling arguments of its own any more: they go as extra_body, as older SDKs sent them)


class Setup:
    def __init__(self, url: str, stub: SamplingStub, database_url: str) -> None:
        self.url, self.stub, self.database_url = url, stub, database_url

    def rollout(self, **body) -> dict:
        created = requests.post(f"{self.url}/rollouts", json={"task_id": "greedy", **body})
        assert created.status_code == 201, created.text
        return created.json()

    def chat(self, base_url: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)

    def claude(self, base_url: str) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=base_url.removesuffix("/v1"), api_key="unused", max_retries=0)

    def calls(self, rollout_id: str) -> list[dict]:
        return requests.get(f"{self.url}/rollouts/{rollout_id}").json()["calls"]

    def sent(self) -> list[dict]:
        """The generation bodies the engine received since the last look."""
        bodies = [json.loads(raw) for path, raw in self.stub.bodies if path.endswith("/completions")]
        self.stub.bodies.clear()
        return bodies


@pytest.fixture(scope="module")
def setup(postgres_server, run_dir):
    stub = SamplingStub()
    flags = [arg for rule in RULES for arg in ("--rollout-sampling", rule)] + ["--policy-rule", "agent:coder=coder"]
    with engine_in_thread(stub) as engine_url, fresh_database(postgres_server) as database_url:
        with running_proxy([engine_url], database_url, run_dir, "proxy-rollout-sampling", *flags) as url:
            yield Setup(url, stub, database_url)


def without(body: dict, *fields: str) -> dict:
    return {k: v for k, v in body.items() if k not in fields}


def test_a_greedy_agents_training_calls_are_sampled_at_the_set_temperature_on_every_wire_format(setup):
    rollout = setup.rollout()
    setup.sent()
    chat = setup.chat(rollout["base_url"])
    chat.chat.completions.create(model="stub-model", messages=HI, temperature=0, seed=7, max_tokens=5)
    list(chat.chat.completions.create(model="stub-model", messages=HI, temperature=0, stream=True))
    chat.completions.create(model="stub-model", prompt="hi", temperature=0)
    chat.responses.create(model="stub-model", input="hi", temperature=0)
    setup.claude(rollout["base_url"]).messages.create(model="stub-model", max_tokens=16, messages=HI,
                                                     extra_body={"temperature": 0})
    sent = setup.sent()
    assert [body["temperature"] for body in sent] == [1.0] * 5
    calls = setup.calls(rollout["rollout_id"])
    assert [call["route"] for call in calls] == ["chat", "chat", "completions", "responses", "messages"]
    assert [call["request"]["temperature"] for call in calls] == [0] * 5  # the agent's own request, as it came
    assert [call["sampling_override"] for call in calls] == [CHANGED] * 5
    assert [call["sampling"] for call in calls] == [None] * 5  # what the engine sampled with: temperature 1
    shown = requests.get(f"{setup.url}/ui/api/rollouts/{rollout['rollout_id']}").json()["calls"]  # the web view's
    assert [call["sampling_override"] for call in shown] == [CHANGED] * 5
    # nothing else changed: the body is the agent's, with the proxy's capture fields
    assert without(sent[0], "temperature") == {"model": "stub-model", "messages": HI, "seed": 7, "max_tokens": 5,
                                               "return_token_ids": True, "logprobs": True}


def test_evaluation_rollouts_and_calls_without_a_rollout_keep_the_agents_sampling(setup):
    evaluation = setup.rollout(eval=True)
    marked = setup.rollout()
    setup.sent()
    setup.chat(evaluation["base_url"]).chat.completions.create(model="stub-model", messages=HI, temperature=0)
    setup.claude(evaluation["base_url"]).messages.create(model="stub-model", max_tokens=16, messages=HI,
                                                         extra_body={"temperature": 0})
    marking = setup.chat(marked["base_url"])
    marking.chat.completions.create(model="stub-model", messages=HI, temperature=0,
                                    extra_headers={"X-Rlproxy-Eval": "1"})
    marking.chat.completions.create(model="stub-model", messages=HI, temperature=0)  # marked once: stays evaluation
    setup.chat(f"{setup.url}/v1").chat.completions.create(model="stub-model", messages=HI, temperature=0)
    assert [body["temperature"] for body in setup.sent()] == [0] * 5
    for rollout in (evaluation, marked):
        calls = setup.calls(rollout["rollout_id"])
        assert [(c["sampling"], c["sampling_override"]) for c in calls] == [("temperature=0", None)] * 2


def test_a_rule_holds_for_its_agent_or_policy_alone_and_the_trainer_scores_what_the_engine_sampled(setup):
    planner = setup.rollout(agent="planner")  # calls on its plain base URL are the planner's
    other = setup.rollout()
    setup.sent()
    setup.chat(planner["base_url"]).chat.completions.create(model="stub-model", messages=HI, temperature=0.2)
    coder = setup.chat(other["base_url"].replace("/v1", "/agents/coder/v1"))
    coder.chat.completions.create(model="stub-model", messages=HI, temperature=0.5, extra_body={"top_k": 20})
    coder.chat.completions.create(model="stub-model", messages=HI, temperature=0.5)  # asked no top_k: unchanged
    planner_sent, coder_sent, unchanged = setup.sent()
    assert (planner_sent["temperature"], planner_sent["top_p"]) == (0.8, 0.95)
    assert (coder_sent["temperature"], coder_sent["top_k"]) == (0.5, 0)
    assert without(unchanged, "logprobs", "return_token_ids") == {"model": "stub-model", "messages": HI,
                                                                   "temperature": 0.5}
    [planned] = setup.calls(planner["rollout_id"])
    assert planned["sampling_override"] == {"rule": RULES[0], "asked": {"temperature": 0.2, "top_p": None},
                                            "sent": {"temperature": 0.8, "top_p": 0.95}}
    coded, plain = setup.calls(other["rollout_id"])
    assert (coded["policy_name"], coded["sampling_override"]["sent"], plain["sampling_override"]) == \
        ("coder", {"top_k": 0}, None)

    for rollout in (planner, other):
        assert requests.post(f"{setup.url}/reward", json={"rollout_id": rollout["rollout_id"],
                                                          "reward": 1.0}).status_code == 200

    async def as_the_trainer_reads_them():
        db = open_database(setup.database_url)
        try:
            async with session_factory(db)() as session:
                rollouts = await load_rollouts(session, [planner["rollout_id"], other["rollout_id"]])
        finally:
            await db.dispose()
        return {call.id: sampled_with(call) for rollout in rollouts for call in rollout.calls}

    sampled = asyncio.run(as_the_trainer_reads_them())
    assert sampled[planned["call_id"]] == Sampled(temperature=0.8, top_p=0.95)
    assert sampled[coded["call_id"]] == sampled[plain["call_id"]] == Sampled(temperature=0.5)


@pytest.mark.parametrize("asked,message", [
    ({"top_p": 0}, "top_p must be in (0, 1], got 0.0. (parameter=top_p, value=0.0)"),
    ({"temperature": 2.5}, "temperature must be in [0, 2], got 2.5. (parameter=temperature, value=2.5)"),
])
def test_sampling_the_engine_refuses_reaches_the_agent_as_a_400_in_its_routes_format(setup, asked, message):
    rollout = setup.rollout(eval=True)  # the agent's own sampling goes upstream
    with pytest.raises(openai.BadRequestError) as chat_refused:
        setup.chat(rollout["base_url"]).chat.completions.create(model="stub-model", messages=HI, **asked)
    assert chat_refused.value.body["message"] == message
    with pytest.raises(anthropic.BadRequestError) as claude_refused:
        setup.claude(rollout["base_url"]).messages.create(model="stub-model", max_tokens=16, messages=HI,
                                                         extra_body=asked)
    assert claude_refused.value.body == {"type": "error", "error": {"type": "invalid_request_error",
                                                                    "message": message}}
    calls = setup.calls(rollout["rollout_id"])
    assert [(c["status"], c["http_status"]) for c in calls] == [("upstream_error", 400)] * 2  # never trained


def test_temperature_0_with_n_above_1_is_refused_and_a_training_rollout_samples_it(setup):
    evaluation, training = setup.rollout(eval=True), setup.rollout()
    with pytest.raises(openai.BadRequestError, match="n must be 1 when using greedy sampling, got 2"):
        setup.chat(evaluation["base_url"]).chat.completions.create(model="stub-model", messages=HI, temperature=0,
                                                                   n=2)
    answer = setup.chat(training["base_url"]).chat.completions.create(model="stub-model", messages=HI,
                                                                      temperature=0, n=2)
    assert len(answer.choices) == 2
    [call] = setup.calls(training["rollout_id"])
    assert call["sampling_override"] == CHANGED and len(call["choices"]) == 2


def test_a_rule_that_cannot_be_used_stops_the_proxy_at_start_saying_why(database_url):
    started = subprocess.run([PYTHON, "-m", "rlproxy.cli", "serve", "--database-url", database_url, "--no-migrate",
                              "--upstream", "http://127.0.0.1:9", "--rollout-sampling", "agent:aider/temperature=0"],
                             capture_output=True, text=True, timeout=60)
    assert started.returncode != 0
    assert "rollout sampling 'agent:aider/temperature=0': temperature must be between 0.01 and 2" in started.stderr
