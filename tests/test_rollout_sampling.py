"""`rlproxy serve --rollout-sampling`: its rules, checked when the proxy starts, and what one does to a request
(core/rollout_sampling.py); and the sampling edges the trainer meets: a temperature the engine raises, a top_k
past the vocabulary, the choices of one call. Pure: no process, no database."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from core.policy_rules import RuleError
from core.rollout_sampling import RolloutSampling, SamplingRule
from core.sampling_rules import Sampled, parse_sampled
from core.settings import TrainingSettings
from core.settings.serve import ProxySettings
from store.training import CallData, RolloutData
from trainer.batch import build_transitions
from trainer.sampled import sampled_with, unreproducible
from trainer.transitions import SkipReasons


def test_a_rule_without_a_scope_sets_every_training_call():
    rule = SamplingRule.parse("temperature=1.0,top_p=1.0")
    assert rule.values == (("temperature", 1.0), ("top_p", 1.0))
    assert rule.matches("coder", "aider") and rule.matches(None, None)


def test_a_rule_is_scoped_to_a_policy_or_an_agent_and_the_first_that_holds_applies():
    rules = RolloutSampling.parse(["agent:aider/temperature=0.8,top_k=-1", "policy:coder/temperature=1.0",
                                   "temperature=0.9"])
    assert rules.rule_for("coder", "aider").text == "agent:aider/temperature=0.8,top_k=-1"
    assert rules.rule_for("coder", "aider").values == (("temperature", 0.8), ("top_k", 0))  # -1 is vLLM's "none"
    assert rules.rule_for("coder", "planner").text == "policy:coder/temperature=1.0"
    assert rules.rule_for("default", None).text == "temperature=0.9"
    assert not RolloutSampling.parse([]) and RolloutSampling.parse([]).rule_for("default", "a") is None
    assert RolloutSampling.parse(["agent:a.b@c:d/temperature=1"]).rule_for(None, "a.b@c:d") is not None


@pytest.mark.parametrize("text,says", [
    ("temperature=0", "temperature must be between 0.01 and 2 (0 is greedy"),
    ("temperature=0.005", "vLLM samples below 0.01 at 0.01"),
    ("temperature=2.5", "refuses above 2"),
    ("temperature=nan", "temperature must be between"),
    ("temperature=hot", "temperature must be a number, not 'hot'"),
    ("top_p=0", "top_p must be above 0 and at most 1"),
    ("top_p=1.5", "top_p must be above 0 and at most 1"),
    ("top_k=-2", "top_k must be 0 (none) or more"),
    ("top_k=2.5", "top_k must be an integer"),
    ("min_p=0", "'min_p' cannot be set; only temperature, top_p, top_k"),
    ("temperature=1,temperature=0.5", "temperature is given twice"),
    ("temperature", "'temperature' is not FIELD=VALUE"),
    ("", "is not FIELD=VALUE"),
    ("project:acme/temperature=1", "must be policy:NAME or agent:NAME"),
    ("agent:/temperature=1", "must be policy:NAME or agent:NAME"),
    ("agent:a b/temperature=1", "is not an agent name"),
    ("policy:base/temperature=1", "the base policy is never trained"),
    ("policy:no way/temperature=1", "policy name 'no way'"),
])
def test_a_rule_that_cannot_be_used_is_refused_saying_why(text, says):
    with pytest.raises(RuleError) as refused:
        RolloutSampling.parse([text])
    assert says in str(refused.value)


@pytest.mark.parametrize("rules", [["temperature=1", "agent:aider/temperature=0.8"],
                                   ["agent:aider/temperature=1", "agent:aider/top_p=0.9"]])
def test_a_rule_that_could_never_apply_is_refused(rules):
    with pytest.raises(RuleError, match="never applies"):
        RolloutSampling.parse(rules)


def test_the_settings_refuse_a_bad_rule_when_the_proxy_starts():
    with pytest.raises(ValueError, match="top_p must be above 0"):
        ProxySettings(rollout_sampling=("agent:aider/top_p=0",))
    settings = ProxySettings(rollout_sampling=("agent:aider/temperature=1.0,top_p=1.0", "temperature=0.9"))
    assert settings.sampling_rules().rule_for("default", "aider").values == (("temperature", 1.0), ("top_p", 1.0))


def test_applying_a_rule_sets_only_what_differs_and_says_what_the_agent_asked():
    rule = SamplingRule.parse("temperature=1.0,top_p=1.0,top_k=0")
    body = {"model": "m", "messages": [], "temperature": 0, "top_k": 20, "seed": 7}
    sent, changed = rule.apply(body)
    assert sent == {"model": "m", "messages": [], "temperature": 1.0, "top_k": 0, "seed": 7}
    assert changed == {"rule": "temperature=1.0,top_p=1.0,top_k=0", "asked": {"temperature": 0, "top_k": 20},
                       "sent": {"temperature": 1.0, "top_k": 0}}
    assert body["temperature"] == 0  # the agent's own request is left as it came
    # an absent field is vLLM's default: nothing to change, nothing recorded
    assert rule.apply({"model": "m"}) == ({"model": "m"}, None)
    assert rule.apply({"temperature": 1, "top_k": -1}) == ({"temperature": 1, "top_k": -1}, None)
    # a value the engine would refuse is replaced like any other
    assert SamplingRule.parse("temperature=0.7").apply({"temperature": 3})[1]["asked"] == {"temperature": 3}


def test_a_temperature_the_engine_raises_to_001_is_scored_at_001():
    """vLLM samples 0 < t < 0.01 at 0.01 (vllm/sampling_params.py): the trainer scores what was sampled."""
    assert parse_sampled("temperature=0.005") == Sampled(temperature=0.01)
    assert parse_sampled("temperature=0.005 top_k=5") == Sampled(temperature=0.01, top_k=5)
    assert parse_sampled("temperature=0.5") == Sampled(temperature=0.5)
    assert parse_sampled("temperature=0") == Sampled(temperature=0.0)  # greedy stays greedy


def call(sampling: str | None, choices: int = 1, cid: str = "c1", logprobs_mode: str | None = "processed") -> CallData:
    return CallData(id=cid, seq=1, agent="solver", policy_version=0, prompt_ids=[1, 2, 3], prefix_kind=None,
                    choices=[([4 + i, 5], [-0.5, -0.25]) for i in range(choices)], policy="default",
                    sampling=sampling, logprobs_mode=logprobs_mode)


def test_each_edge_of_a_calls_sampling_is_trained_or_skipped_with_its_reason():
    # a top_k past the vocabulary: the engine keeps it all, and so does the trainer (trainer/truncation.py)
    assert sampled_with(call("top_k=1000000")) == Sampled(top_k=1_000_000) and unreproducible(call("top_k=1000000")) is None
    # top_p 0: vLLM refuses it (nothing recorded to train); an engine that samples it keeps the most probable token
    assert sampled_with(call("top_p=0")) == Sampled(top_p=0.0)
    # temperature 0 (n > 1 at temperature 0 vLLM refuses): greedy, skipped under its own reason
    assert unreproducible(call("temperature=0")) == "greedy_sampling"
    # a temperature vLLM refuses (above 2) fails at the engine; its recorded text still parses as what was asked
    assert sampled_with(call("temperature=3")) == Sampled(temperature=3.0)
    # tempered raw log-probs (an engine left at vLLM's default) are not the behaviour
    assert unreproducible(call("temperature=0.7", logprobs_mode="raw")) == "sampling_altered"


def test_every_choice_of_one_call_is_scored_at_the_calls_one_sampling():
    """One request has one set of sampling parameters, recorded once per call (`calls.sampling`): the choices of
    an n > 1 call cannot differ, and each is trained at it."""
    rollouts = [RolloutData(id=f"r{i}", task_id="t", reward=float(i), finished_at=datetime.now(timezone.utc),
                            calls=[call("temperature=0.7 top_p=0.95", choices=2, cid=f"c{i}")]) for i in range(2)]
    skips = SkipReasons()
    transitions = build_transitions(rollouts, TrainingSettings(choices_trained="all"), 0, skips)
    assert len(transitions) == 4
    assert {t.sampled for t in transitions} == {Sampled(temperature=0.7, top_p=0.95)}
