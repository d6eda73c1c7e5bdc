"""Sampling parameters the operator sets for training rollouts (`rlproxy serve --rollout-sampling`), in place of
the agent's own: a greedy agent (temperature 0) repeats one attempt, so a group of its attempts has nothing to
learn from; sampled at temperature 1 its attempts differ and the trainer learns from the difference.

A rule is `[SCOPE/]FIELD=VALUE[,FIELD=VALUE...]`, SCOPE being `policy:NAME` or `agent:NAME`; FIELD one of
`temperature`, `top_p`, `top_k` (what the trainer rebuilds from its own logits, so the changed call is trained as
it was sampled):

    temperature=1.0                       every training rollout's calls
    temperature=1.0,top_p=1.0,top_k=0     the same, and the agent's truncation removed
    policy:coder/temperature=1.0          the calls the `coder` policy answers
    agent:aider/temperature=0.8,top_p=0.95

Rules are tried in the order given and the first whose scope holds applies; a rule after one without a scope (or
after another of the same scope) could never apply and is refused. Values are checked against what vLLM 0.32
samples as asked: temperature 0.01-2 (it refuses above 2 and raises anything between 0 and 0.01 to 0.01; 0 is the
greedy sampling the setting exists to replace), top_p in (0, 1], top_k 0 (none) or more. Pure: the settings
validate with it, the proxy applies it (proxy/policy/sampling.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from core.ids import is_valid_id
from core.policy_rules import BASE_POLICY, RuleError, check_policy_name

FIELDS = ("temperature", "top_p", "top_k")
NEUTRAL: dict[str, float | int] = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}  # an absent field, as vLLM reads it
MIN_TEMPERATURE = 0.01  # vLLM samples 0 < t < 0.01 at 0.01 (vllm/sampling_params.py, _MAX_TEMP)
MAX_TEMPERATURE = 2.0  # and refuses above 2
SCOPES = ("policy", "agent")
SYNTAX = "[policy:NAME/|agent:NAME/]FIELD=VALUE[,FIELD=VALUE...] with FIELD temperature, top_p or top_k"


@dataclass(frozen=True, slots=True)
class SamplingRule:
    scope: str | None  # "policy", "agent", or None: every training call
    name: str | None
    values: tuple[tuple[str, float | int], ...]  # (field, value) in the order given
    text: str

    @classmethod
    def parse(cls, text: str) -> SamplingRule:
        text = text.strip()
        scope = name = None
        head, slash, settings = text.rpartition("/")
        if slash:
            scope, colon, name = head.partition(":")
            if not colon or scope not in SCOPES or not name:
                raise RuleError(f"rollout sampling {text!r}: {head!r} must be policy:NAME or agent:NAME ({SYNTAX})")
            _check_name(scope, name, text)
        values: dict[str, float | int] = {}
        for part in settings.split(","):
            field, eq, value = part.strip().partition("=")
            if not eq or not field or not value.strip():
                raise RuleError(f"rollout sampling {text!r}: {part.strip()!r} is not FIELD=VALUE ({SYNTAX})")
            if field not in FIELDS:
                raise RuleError(f"rollout sampling {text!r}: {field!r} cannot be set; only {', '.join(FIELDS)} "
                                "(what the trainer rebuilds, so the call is trained as it was sampled)")
            if field in values:
                raise RuleError(f"rollout sampling {text!r}: {field} is given twice")
            values[field] = _value(field, value.strip(), text)
        return cls(scope, name, tuple(values.items()), text)

    def matches(self, policy: str | None, agent: str | None) -> bool:
        if self.scope is None:
            return True
        return (policy if self.scope == "policy" else agent) == self.name

    def apply(self, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """`body` with this rule's values where the agent's differ from them (an absent field read as vLLM's
        default), and what changed: `{"rule", "asked": {field: the agent's value or None}, "sent": {field:
        value}}`; `(body, None)` when the agent asked for these values already."""
        asked: dict[str, Any] = {}
        sent: dict[str, Any] = {}
        for field, value in self.values:
            if _effective(field, body.get(field)) != value:
                asked[field], sent[field] = body.get(field), value
        if not sent:
            return body, None
        return {**body, **sent}, {"rule": self.text, "asked": asked, "sent": sent}


@dataclass(frozen=True, slots=True)
class RolloutSampling:
    rules: tuple[SamplingRule, ...] = ()

    @classmethod
    def parse(cls, texts: tuple[str, ...] | list[str] = ()) -> RolloutSampling:
        rules = tuple(SamplingRule.parse(text) for text in texts)
        for i, rule in enumerate(rules):
            for earlier in rules[:i]:
                if earlier.scope is None or (earlier.scope, earlier.name) == (rule.scope, rule.name):
                    raise RuleError(f"rollout sampling {rule.text!r} never applies: {earlier.text!r} before it "
                                    "takes every call it would (the first rule that holds applies)")
        return cls(rules)

    def __bool__(self) -> bool:
        return bool(self.rules)

    def rule_for(self, policy: str | None, agent: str | None) -> SamplingRule | None:
        """The rule for a training call the named policy answers for `agent`, or None."""
        for rule in self.rules:
            if rule.matches(policy, agent):
                return rule
        return None


def _check_name(scope: str, name: str, text: str) -> None:
    if scope == "policy":
        check_policy_name(name)
        if name == BASE_POLICY:
            raise RuleError(f"rollout sampling {text!r}: the base policy is never trained, so its calls are never "
                            "changed")
    elif not is_valid_id(name, "agent"):
        raise RuleError(f"rollout sampling {text!r}: {name!r} is not an agent name (letters, digits and ._:@-)")


def _value(field: str, value: str, text: str) -> float | int:
    try:
        number: float | int = int(value) if field == "top_k" else float(value)
    except ValueError:
        kind = "an integer" if field == "top_k" else "a number"
        raise RuleError(f"rollout sampling {text!r}: {field} must be {kind}, not {value!r}") from None
    if field == "temperature" and not (math.isfinite(number) and MIN_TEMPERATURE <= number <= MAX_TEMPERATURE):
        raise RuleError(f"rollout sampling {text!r}: temperature must be between {MIN_TEMPERATURE} and "
                        f"{MAX_TEMPERATURE:g} (0 is greedy: no attempt differs from another; vLLM samples below "
                        f"{MIN_TEMPERATURE} at {MIN_TEMPERATURE} and refuses above {MAX_TEMPERATURE:g}), not {value}")
    if field == "top_p" and not (math.isfinite(number) and 0 < number <= 1):
        raise RuleError(f"rollout sampling {text!r}: top_p must be above 0 and at most 1, not {value}")
    if field == "top_k":
        if number == -1:
            return 0  # vLLM's other spelling of "no top-k"
        if number < 0:
            raise RuleError(f"rollout sampling {text!r}: top_k must be 0 (none) or more, not {value}")
    return number


def _effective(field: str, value: Any) -> Any:
    """What vLLM samples with for the agent's value of `field` (absent: its neutral default)."""
    if value is None:
        return NEUTRAL[field]
    if field == "top_k" and value == -1:
        return 0
    if field == "temperature" and isinstance(value, (int, float)) and 0 < value < MIN_TEMPERATURE:
        return MIN_TEMPERATURE
    return value
