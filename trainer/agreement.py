"""Whether the engines serve the policy the trainer trained.

A version the trainer holds is the one that sampled the calls of it in the step's batch (lag 0): before its first
update the trainer's log-probs of those tokens and the engine's must agree up to numerics. When they do not, the
engines serve other weights under the version's name (an adapter that never loaded, a replica that kept the base
model) and everything trained from that traffic is off-policy in a way nothing else reports. Each step measures it
(trainer/step_metrics.py: `agreement_kl`, `agreement_abs`); here it is exported per policy and version, checked
against `agreement_alarm_kl`, logged as an ALERT line when it passes, and kept for the policy's row
(`GET /policies`: `agreement`).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from core.step_record import StepMetrics
from trainer.metrics import TrainerMetrics

log = logging.getLogger("rlproxy.trainer")


@dataclass
class Agreement:
    policy: str
    version: int
    kl: float  # KL(engine || trainer) per token, k3 estimate
    mean_abs: float  # mean |engine log-prob - trainer log-prob|
    tokens: int
    bound: float
    alarm: bool

    def as_dict(self) -> dict[str, Any]:
        return {"version": self.version, "kl": self.kl, "mean_abs": self.mean_abs, "tokens": self.tokens,
                "bound": self.bound, "alarm": self.alarm}


class AgreementWatch:
    def __init__(self, bound: float, metrics: TrainerMetrics) -> None:
        self.bound = bound  # 0: measure, never alarm
        self.metrics = metrics
        self._exported: dict[str, str] = {}  # policy -> the version label its gauge carries now

    def check(self, policy: str, step: StepMetrics) -> Agreement | None:
        """The agreement a step measured (None when no call of its batch had lag 0), exported and alarmed on."""
        if step.agreement_kl is None or step.served_version is None:
            return None
        found = Agreement(policy, int(step.served_version), float(step.agreement_kl),
                          float(step.agreement_abs or 0.0), int(step.agreement_tokens), self.bound,
                          alarm=self.bound > 0 and step.agreement_kl > self.bound)
        self._export(found)
        if found.alarm:
            self.metrics.agreement_alarms.labels(policy).inc()
            log.warning("ALERT policy %r v%d is not served as trained: on %d tokens of the calls it served, the "
                        "engine's log-probs differ from the trainer's by KL %.4f per token (mean |diff| %.4f; "
                        "agreement_alarm_kl %.4f). Check that every engine loaded the adapter (GET /policies, the "
                        "engines' /v1/models) and serves it, not the base model.", policy, found.version,
                        found.tokens, found.kl, found.mean_abs, self.bound)
        return found

    def _export(self, found: Agreement) -> None:
        """One series per policy: the latest version measured (its label says which)."""
        gauge = self.metrics.served_agreement_kl
        label = str(found.version)
        previous = self._exported.get(found.policy)
        if previous is not None and previous != label:
            gauge.remove(found.policy, previous)
        gauge.labels(found.policy, label).set(found.kl)
        self._exported[found.policy] = label
