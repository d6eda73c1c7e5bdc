"""The operator's rollout sampling (core/rollout_sampling.py) applied to one call, before its body goes upstream.

Only a call the trainer may learn from is changed: one of a rollout (a call without one is never trained), answered
by a named policy's version (not the base policy, not a model asked for by another name), whose rollout is not
evaluation traffic (`X-Rlproxy-Eval`, or created with `"eval": true`: evaluation measures the agent as it samples
itself). The rule is chosen by the policy that answers and the call's agent (its rollout's agent when the call
names none). The recorded `request` stays the agent's own; what was changed is recorded beside it
(`calls.sampling_override`), and `calls.sampling` is read from the body sent upstream, so the trainer scores the
call at the values it was sampled with.
"""
from __future__ import annotations

from typing import Any

from core.policy_rules import BASE_POLICY
from core.rollout_sampling import RolloutSampling
from proxy.context import CallContext
from proxy.policy.router import PolicyRouter, Route


async def resample(rules: RolloutSampling, router: PolicyRouter, context: CallContext, target: Route,
                   engine_body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The engine's body for this call under the rules, and what was changed (None: nothing)."""
    if not rules or context.rollout_id is None or target.policy_version is None or target.policy == BASE_POLICY:
        return engine_body, None
    evaluation, rollout_agent = await router.rollout_kind(context.rollout_id)
    if context.eval:
        router.mark_eval(context.rollout_id, rollout_agent)
        return engine_body, None
    if evaluation:
        return engine_body, None
    rule = rules.rule_for(target.policy, context.agent or rollout_agent)
    if rule is None:
        return engine_body, None
    return rule.apply(engine_body)
