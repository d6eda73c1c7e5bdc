"""Prometheus metrics of the trainer (same conventions as the proxy's)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from core.step_record import gauge_fields
from engine.fleet import FleetMetrics

STEP_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)
LAG_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64)  # versions
AGE_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 21600)  # seconds
REWARD_BUCKETS = (-1, -0.5, 0, 0.25, 0.5, 0.75, 1, 2, 5)  # as the proxy's reward histograms


class TrainerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.steps = Counter("rlproxy_trainer_steps_total", "Training steps finished.", registry=r)
        # One gauge per step record field that names one (core/step_record.py), set after each step.
        self.step_gauges = {name: Gauge(metric, description, registry=r)
                            for name, (metric, description) in gauge_fields().items()}
        self.reward_mean = Gauge("rlproxy_trainer_reward_mean", "Mean final reward of the step's rollouts.",
                                 registry=r)
        self.reward_std = Gauge("rlproxy_trainer_reward_std", "Std of the step's final rewards.", registry=r)
        self.advantage_std = Gauge("rlproxy_trainer_advantage_std", "Std of the step's advantages.", registry=r)
        self.tokens = Counter("rlproxy_trainer_tokens_total", "Tokens trained on.", registry=r)
        self.step_duration = Histogram("rlproxy_trainer_step_duration_seconds", "Duration of one PPO step.",
                                       buckets=STEP_BUCKETS, registry=r)
        self.publish_duration = Histogram("rlproxy_trainer_publish_duration_seconds",
                                          "From step end to the new version serving.", buckets=STEP_BUCKETS,
                                          registry=r)
        self.active_version = Gauge("rlproxy_trainer_active_policy_version",
                                    "Version serving of the first policy this trainer trains.", registry=r)
        self.policy_version = Gauge("rlproxy_trainer_policy_version",
                                    "Version serving of each named policy this trainer trains.", ["policy"],
                                    registry=r)
        self.policy_steps = Counter("rlproxy_trainer_policy_steps_total",
                                    "Versions trained, by named policy (a step trains each policy with calls in it).",
                                    ["policy"], registry=r)
        self.rollouts_waiting = Gauge("rlproxy_trainer_rollouts_waiting", "Rewarded rollouts not yet trained.",
                                      registry=r)
        self.rollouts_trained = Counter("rlproxy_trainer_rollouts_trained_total", "Rollouts consumed.", registry=r)
        self.rollouts_expired = Counter("rlproxy_trainer_rollouts_expired_total",
                                        "Rollouts marked expired: no final reward within reward_ttl_s.", registry=r)
        self.pruned_rollouts = Counter("rlproxy_trainer_pruned_rollouts_total",
                                       "Rollouts deleted by the trainer's pruning.", registry=r)
        self.saves_skipped = Counter("rlproxy_trainer_saves_skipped_total",
                                     "Steps not saved or published: too little free space for an adapter version "
                                     "in adapters_dir (their rollouts wait).", registry=r)
        self.adapters_removed = Counter("rlproxy_trainer_adapters_removed_total",
                                        "Version folders removed by retention (keep_versions).", registry=r)
        self.pruned_calls = Counter("rlproxy_trainer_pruned_calls_total", "Calls deleted by the trainer's pruning.",
                                    registry=r)
        self.pruned_bodies = Counter("rlproxy_trainer_pruned_bodies_total",
                                     "Calls whose request and response bodies the trainer's pruning cleared.",
                                     registry=r)
        self.judge_groups = Counter(
            "rlproxy_trainer_judge_groups_total",
            "Task groups the judge was asked to score, by outcome: judged, bad_output (no reply kept the JSON "
            "contract in judge_attempts tries), unreachable, refused (the judge rejected the request), error (anything "
            "else failed; logged).",
            ["outcome"], registry=r)
        self.judged_rollouts = Counter("rlproxy_trainer_judged_rollouts_total",
                                       "Rollouts whose final reward the judge gave (or weighed, judge+posted).",
                                       registry=r)
        self.skipped = Counter("rlproxy_trainer_skipped_calls_total", "Calls not trained on, by reason.",
                               ["reason"], registry=r)
        self.calls_seen = Counter("rlproxy_trainer_calls_seen_total",
                                  "Calls a step consumed, by the policy that answered them and agent name.",
                                  ["policy", "agent"], registry=r)
        self.calls_trained = Counter("rlproxy_trainer_calls_trained_total",
                                     "Calls trained, by policy and agent name.", ["policy", "agent"], registry=r)
        self.calls_skipped = Counter("rlproxy_trainer_calls_not_trained_total",
                                     "Calls a step consumed and did not train, by policy, agent name and reason "
                                     "(each call once: calls.train_decision).", ["policy", "agent", "reason"],
                                     registry=r)
        self.yield_alerts = Counter(
            "rlproxy_trainer_yield_alerts_total",
            "ALERT lines: more than yield_alert_share of a policy's calls over the last yield_window steps skipped "
            "for one reason (reason), or its recent task groups greedy (reason 'greedy').", ["policy", "reason"],
            registry=r)
        self.trained_call_lag = Histogram(
            "rlproxy_trainer_trained_call_lag_versions",
            "Calls trained on, by how many versions of their policy's line the trainer had moved on since the version "
            "that sampled them (0: on-policy).", buckets=LAG_BUCKETS, registry=r)
        self.dropped_call_lag = Histogram(
            "rlproxy_trainer_dropped_call_lag_versions",
            "Calls dropped as stale (more than max_staleness versions behind), by their lag in versions.",
            buckets=LAG_BUCKETS, registry=r)
        self.trained_call_age = Histogram(
            "rlproxy_trainer_trained_call_age_seconds",
            "Calls trained on, by seconds from their being sent to the engine to the step that trained them.",
            buckets=AGE_BUCKETS, registry=r)
        self.served_agreement_kl = Gauge(
            "rlproxy_trainer_served_agreement_kl",
            "Per policy, for the latest version measured: KL per token between the engines' log-probs of the calls "
            "that version served (lag 0) and the trainer's of that version. High: the engines do not serve the "
            "trained adapter (see agreement_alarm_kl).", ["policy", "version"], registry=r)
        self.agreement_alarms = Counter(
            "rlproxy_trainer_agreement_alarms_total",
            "Versions whose served agreement passed agreement_alarm_kl (an ALERT line each).", ["policy"], registry=r)
        self.retokenized_mismatches = Counter(
            "rlproxy_trainer_retokenized_mismatches_total",
            "Sequences whose re-tokenized ids differ from the recorded ones (token_source=retokenized only).",
            registry=r)
        self.gate_parent_unscored = Counter(
            "rlproxy_trainer_gate_parent_unscored_total",
            "Command gate runs that could not score the parent version (so the candidate was retired), by why: "
            "not-served, exit, timeout, no-score, not-started. Any increase needs an operator.", ["why"], registry=r)
        self.publish_failures = Counter("rlproxy_trainer_publish_failures_total", "Adapters that failed to load.",
                                        registry=r)
        self.lost_leases = Counter(
            "rlproxy_trainer_lost_leases_total",
            "Steps not recorded because their rollouts were no longer leased to this trainer (the lease ran out "
            "during the step, or another process with the same worker id took them). Any increase needs an "
            "operator: raise lease_seconds, or give each trainer its own worker_id.", registry=r)
        self.publish_declined = Counter(
            "rlproxy_trainer_publish_declined_total",
            "Trained versions not made active because the policy's active version changed while they trained "
            "(an operator's activation or rollback): retired, and training goes on from the active one.",
            registry=r)
        # a policy with a teacher (trainer/distill.py, docs/distillation.md)
        self.teacher_kl = Gauge(
            "rlproxy_trainer_teacher_kl",
            "Last step of a policy with a teacher: mean reverse KL per sampled token between the student and its "
            "teacher (student log-prob - teacher log-prob); it falls as the student learns.", ["policy"], registry=r)
        self.teacher_unscored = Counter(
            "rlproxy_trainer_teacher_unscored",
            "Sequences of a policy with a teacher trained without the teacher's gap (the teacher could not score "
            "them: timeout, budget, error), by reason.", ["policy", "reason"], registry=r)
        self.fleet = FleetMetrics(r)  # replicas its publishes left out of rotation (engine/fleet.py)
        # The proxy's evaluation reward metrics, for the rollouts this trainer marks by agent (--eval-agents);
        # the proxy counts those marked at creation or by header. Sum both jobs by policy.
        self.eval_reward_value = Histogram("rlproxy_eval_reward_value",
                                           "Final reward values of evaluation rollouts.", ["policy"],
                                           buckets=REWARD_BUCKETS, registry=r)
        self.eval_reward_sum = Gauge("rlproxy_eval_reward_sum", "Sum of final reward values of evaluation "
                                     "rollouts (a gauge: rewards may be negative).", ["policy"], registry=r)

    def observe_eval(self, policy_version: int | None, reward: float) -> None:
        policy = "" if policy_version is None else str(policy_version)
        self.eval_reward_value.labels(policy).observe(reward)
        self.eval_reward_sum.labels(policy).inc(reward)
