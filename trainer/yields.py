"""The yield of a step: per policy and agent name, how many calls it saw, trained, and skipped by reason; and
the ALERT lines when a policy's traffic cannot be learned from.

    report = call_yield(rollouts, policy, decisions)   # {"calls_seen", "calls_trained", "skipped", "agents"}
    watch.observe(policy, report, groups)               # logs and counts the ALERTs over the last window

Every call a policy answered is seen once and decided once (`calls.train_decision`): trained, or skipped under
one reason. The step's own `skipped` counts (trainer/batch.py) are per transition and per rollout where that is
what was dropped; these are per call, so shares add up to the traffic.
"""
from __future__ import annotations

import logging
from collections import Counter, deque
from typing import Any

from core.settings import TrainingSettings
from store.training import RolloutData
from trainer.batch import TRAINED
from trainer.metrics import TrainerMetrics
from trainer.staleness import Staleness
from trainer.sampled import GREEDY, MEDIA_IN_PROMPT, SAMPLING_ALTERED
from trainer.transitions import SkipReasons

log = logging.getLogger("rlproxy.trainer")

SAID_BY_GREEDY = (GREEDY, "zero_advantage")  # what a greedy policy's calls are skipped as
UNDECIDED = "not_decided"  # a call no rule named (never expected: counted so that it would show)

# reason -> what fixes it (the ALERT's advice)
FIXES: dict[str, str] = {
    SAMPLING_ALTERED: "the agent samples with a field the trainer cannot rebuild (penalties, logit_bias, a "
                      "grammar, a forced tool, min_p; see each call's `sampling`): drop it from the agent's "
                      "training runs",
    GREEDY: "the agent samples at temperature 0: sample its training rollouts at the proxy with `rlproxy serve "
            "--rollout-sampling temperature=1.0` (or agent:NAME/temperature=1.0 for this agent alone), or give its "
            "training runs a temperature above 0",
    MEDIA_IN_PROMPT: "images, audio and video are not trained: leave the agent on the base model (a policy rule)",
    SkipReasons.TOO_LONG: "raise max_seq_len (0: the engine's max_model_len) or the engine's --max-model-len",
    "stale_policy": "raise max_staleness, or pace the agent (rlproxy run --max-untrained)",
    "zero_advantage": "every attempt of a task got the same reward: raise group_size or sample more diversely "
                      "(the agent's temperature 1.0, or `rlproxy serve --rollout-sampling temperature=1.0`)",
    "agent_not_trained": "add the agent to train_agents",
    "not_served_by_policy": "the agent asks for another model by name: point it at the policy's model",
    "choice_not_continued": "set choices_trained=all to train every choice of an n > 1 call",
}


def call_yield(rollouts: list[RolloutData], policy: str | None, decisions: dict[str, str]) -> dict[str, Any]:
    """The calls `policy` answered in these rollouts (all calls when None), by agent name."""
    agents: dict[str, dict[str, Any]] = {}
    for rollout in rollouts:
        for call in rollout.calls:
            if policy is not None and call.policy != policy:
                continue
            agent = agents.setdefault(call.agent or "", {"calls_seen": 0, "calls_trained": 0, "skipped": Counter()})
            agent["calls_seen"] += 1
            decision = decisions.get(call.id, UNDECIDED)
            if decision == TRAINED:
                agent["calls_trained"] += 1
            else:
                agent["skipped"][decision] += 1
    skipped: Counter = Counter()
    for agent in agents.values():
        skipped.update(agent["skipped"])
        agent["skipped"] = dict(agent["skipped"])
    return {"calls_seen": sum(a["calls_seen"] for a in agents.values()),
            "calls_trained": sum(a["calls_trained"] for a in agents.values()),
            "calls_skipped": dict(skipped), "agents": agents}


def describe_yield(report: dict[str, Any]) -> str:
    """`12/40 calls trained (sampling_altered 20, too_long 8)` for the step's log line."""
    skipped = ", ".join(f"{reason} {n}" for reason, n in sorted(report["calls_skipped"].items(), key=lambda x: -x[1]))
    return f"{report['calls_trained']}/{report['calls_seen']} calls trained" + (f" ({skipped})" if skipped else "")


def observe_yield(metrics: TrainerMetrics, policy: str, report: dict[str, Any]) -> None:
    for agent, counts in report["agents"].items():
        metrics.calls_seen.labels(policy, agent).inc(counts["calls_seen"])
        metrics.calls_trained.labels(policy, agent).inc(counts["calls_trained"])
        for reason, n in counts["skipped"].items():
            metrics.calls_skipped.labels(policy, agent, reason).inc(n)


class YieldWatch:
    """Per policy, the yields of its last `window` steps. An ALERT when more than `share` of the window's calls
    were skipped for one reason, and one when its recent groups are greedy; each logged once until it clears."""

    def __init__(self, metrics: TrainerMetrics, settings: TrainingSettings) -> None:
        self.metrics = metrics
        self.window = settings.yield_window
        self.share = settings.yield_alert_share  # 0: never alert
        self.recent: dict[str, deque] = {}
        self.alerted: dict[str, set[str]] = {}

    def observe(self, policy: str, report: dict[str, Any], greedy_groups: int = 0, groups: int = 0) -> list[str]:
        """Add a step's yield (and how many of its task groups were greedy, of how many); the reasons alerted now."""
        recent = self.recent.setdefault(policy, deque(maxlen=max(1, self.window)))
        recent.append((report["calls_seen"], Counter(report["calls_skipped"]), greedy_groups, groups))
        seen = sum(r[0] for r in recent)
        skipped: Counter = sum((r[1] for r in recent), Counter())
        alerted = self.alerted.setdefault(policy, set())
        now: list[str] = []
        if self.share <= 0 or seen == 0:
            return now
        greedy, all_groups = sum(r[2] for r in recent), sum(r[3] for r in recent)
        if all_groups and greedy / all_groups > self.share:
            if "greedy" not in alerted:
                alerted.add("greedy")
                now.append("greedy")
                self.metrics.yield_alerts.labels(policy, "greedy").inc()
                log.warning("ALERT policy %r cannot learn: %d of its last %d task groups are greedy (sampled at "
                            "temperature 0, or every attempt the same), so every attempt gets the same reward and "
                            "no advantage. Sample its training rollouts at the proxy: `rlproxy serve "
                            "--rollout-sampling policy:%s/temperature=1.0` (evaluation rollouts keep the agent's "
                            "own sampling), or give the agent's training runs a temperature above 0.",
                            policy, greedy, all_groups, policy)
        else:
            alerted.discard("greedy")
        for reason, n in skipped.items():
            if reason in SAID_BY_GREEDY and "greedy" in alerted:
                continue  # the greedy ALERT says it, and what to set
            if n / seen > self.share:
                if reason not in alerted:
                    alerted.add(reason)
                    now.append(reason)
                    self.metrics.yield_alerts.labels(policy, reason).inc()
                    log.warning("ALERT policy %r: %d of its last %d calls (%.0f%%, over %d steps) were not trained: "
                                "%s. %s", policy, n, seen, 100 * n / seen, len(recent), reason,
                                FIXES.get(reason, "see docs/learning.md"))
            else:
                alerted.discard(reason)
        return now

def greedy_groups(rollouts: list[RolloutData], policy: str | None, decisions: dict[str, str]) -> tuple[int, int]:
    """(greedy, all) task groups of the policy's calls: a group is greedy when its calls were sampled at
    temperature 0, or when it has several attempts whose sampled tokens are all identical."""
    groups: dict[tuple[str | None, str], list[RolloutData]] = {}
    for rollout in rollouts:
        if rollout.task_id is not None:
            groups.setdefault((rollout.project, rollout.task_id), []).append(rollout)
    greedy = 0
    for members in groups.values():
        calls = [c for r in members for c in r.calls if policy is None or c.policy == policy]
        if not calls:
            continue
        at_zero = all(decisions.get(c.id) == GREEDY for c in calls)
        attempts = {_sampled_tokens(r, policy) for r in members}
        if at_zero or (len(members) > 1 and len(attempts) == 1):
            greedy += 1
    return greedy, sum(1 for members in groups.values()
                       if any(policy is None or c.policy == policy for r in members for c in r.calls))


def _sampled_tokens(rollout: RolloutData, policy: str | None) -> tuple:
    """Every token the policy sampled in the rollout, call by call and choice by choice."""
    return tuple(tuple(tokens or ()) for call in rollout.calls if policy is None or call.policy == policy
                 for tokens, _ in call.choices)


class StepYield:
    """One step's decisions and yields, policy by policy (what the worker keeps of each policy's line):

        ledger = StepYield(rollouts, watch)
        report = ledger.line(policy, skips)    # counted, exported, alerted on; the step record's fields
        ledger.decisions                       # call id -> decision, for store.training.record_step
    """

    def __init__(self, rollouts: list[RolloutData], watch: YieldWatch) -> None:
        self.rollouts = rollouts
        self.watch = watch
        self.decisions: dict[str, str] = {}
        self.reports: dict[str, dict[str, Any]] = {}
        self._policy_of = {call.id: call.policy for rollout in rollouts for call in rollout.calls}

    def line(self, policy: str, skips: SkipReasons) -> dict[str, Any]:
        for call_id, decision in skips.decisions.items():
            if self._policy_of.get(call_id) == policy:
                self.decisions[call_id] = decision  # its own policy's line decides
            else:
                self.decisions.setdefault(call_id, decision)  # a call no policy answered: any line's word
        report = call_yield(self.rollouts, policy, skips.decisions)
        observe_yield(self.watch.metrics, policy, report)
        self.watch.observe(policy, report, *greedy_groups(self.rollouts, policy, skips.decisions))
        self.reports[policy] = report
        return report

    def untrained(self, skipped: dict[str, int], lags: Staleness) -> dict[str, Any]:
        """The record of a step that trained no policy: what was dropped, and each policy's yield."""
        return {"skipped": skipped, "staleness": lags.as_dict(), "policies": self.reports}

    def nothing_learned(self, rollouts: int, dropped: str, staleness: str) -> None:
        yields = "; ".join(f"policy {policy!r}: {describe_yield(report)}" for policy, report in self.reports.items())
        log.info("%d rollouts gave nothing to learn from (%s; dropped: %s; %s)", rollouts, yields, dropped, staleness)
