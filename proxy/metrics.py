"""Prometheus metrics of the proxy. One registry per app (so several apps can live in one process, as in
tests); names follow Prometheus conventions with units; labels are low-cardinality (never rollout ids)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from engine.fleet import FleetMetrics

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
REWARD_BUCKETS = (-1, -0.5, 0, 0.25, 0.5, 0.75, 1, 2, 5)


class _KnownLabels:
    """`labels(*values)` that returns a series already made at once: prometheus_client checks the names, turns
    each value into a string and takes its lock on every call (6 us on a loaded 2-core machine, against 1.8 for the
    `inc()` that follows), and every served call asks for four. Its own dict of series is read as it is, so a
    series cleared or removed is made again by the library's `labels`, as are values that are not strings."""

    def labels(self, *values, **named):
        if not named:
            child = getattr(self, "_metrics", {}).get(values)
            if child is not None:
                return child
        return super().labels(*values, **named)


class FastCounter(_KnownLabels, Counter):
    pass


class FastHistogram(_KnownLabels, Histogram):
    pass


# Series labelled by a policy version are kept for the versions that serve and the newest this many: rewards for a
# rollout arrive after its version stopped serving, but each step makes a new version, and a series per version kept
# forever grows the scrape (and Prometheus's index) without bound over weeks of training.
KEPT_VERSIONS = 8


class ProxyMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        # the series every call counts in (proxy/serving.py `_account`): `labels()` finds the known ones at once
        self.requests = FastCounter("rlproxy_requests_total", "Requests answered, by route and outcome.",
                                    ["route", "status", "policy"], registry=r)
        self.request_duration = FastHistogram("rlproxy_request_duration_seconds", "Time from request to last byte.",
                                              ["route", "stream"], buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = FastHistogram("rlproxy_time_to_first_token_seconds", "Time to the first streamed content chunk.",
                                  ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.tokens = FastCounter("rlproxy_tokens_total", "Tokens through the proxy.", ["direction"], registry=r)
        self.in_flight = Gauge("rlproxy_requests_in_flight", "Requests being served.", registry=r)
        self.upstream_errors = Counter("rlproxy_upstream_errors_total", "Upstream failures by kind.", ["kind"],
                                       registry=r)
        self.writer_queue = Gauge("rlproxy_capture_queue_depth", "Calls waiting for the writer.", registry=r)
        self.writer_batch = Histogram("rlproxy_capture_batch_size", "Calls per write transaction.",
                                      buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512), registry=r)
        self.writer_flush = Histogram("rlproxy_capture_flush_duration_seconds", "Duration of one write batch.",
                                      buckets=LATENCY_BUCKETS, registry=r)
        self.late_calls = Counter(
            "rlproxy_capture_late_calls_total",
            "Calls stored after their rollout was trained (a step took the trajectory without them): with several "
            "proxies, raise the trainer's settle_s.", registry=r)
        self.foreign_calls = Counter(
            "rlproxy_capture_foreign_calls_total",
            "Calls of one project whose rollout id belonged to another project by the time they were stored (the id "
            "was pruned and opened again by the other project): kept in the rejected file, not stored.", registry=r)
        self.storage_refused = Counter(
            "rlproxy_storage_budget_refused_total",
            "Requests refused 429 because their project had stored its --project-bytes-per-hour.", registry=r)
        self.rows_written = Counter("rlproxy_capture_calls_written_total", "Calls stored in the database.",
                                    registry=r)
        self.rows_spooled = Counter("rlproxy_capture_calls_spooled_total",
                                    "Calls written to the local spool because the database could not take them.",
                                    registry=r)
        self.spool_pending = Gauge("rlproxy_capture_spool_pending", "Calls in the spool awaiting replay.",
                                   registry=r)
        self.rows_rejected = Counter("rlproxy_capture_calls_rejected_total",
                                     "Calls that could not be stored (the database refused them, or they cannot be written as "
                                     "JSON), kept in the rejected file with the reason.",
                                     registry=r)
        self.write_errors = Counter("rlproxy_capture_write_errors_total", "Failed write transactions.", registry=r)
        self.writer_running = Gauge("rlproxy_capture_writer_running",
                                    "1 while the capture writer runs; 0 while it starts again after a failure "
                                    "(calls are still answered and queued; /readyz answers 503).", registry=r)
        self.writer_restarts = Counter("rlproxy_capture_writer_restarts_total",
                                       "Times the capture writer failed and was started again.", registry=r)
        self.prefix_links = Counter("rlproxy_prefix_links_total",
                                    "How each call's prompt continues the previous call of its rollout.", ["kind"],
                                    registry=r)
        self.rewards = Counter("rlproxy_rewards_total", "Rewards received, by kind and reason.",
                               ["kind", "reason", "policy"], registry=r)
        # Rewards posted to a rollout whose reward another gives (its grader, the judge): kept beside it as claims,
        # never trained on; by kind (final, call) and who posted them (agent, admin, …).
        self.reward_claims = Counter("rlproxy_reward_claims_total", "Rewards kept as claims: posted to a rollout "
                                     "whose reward its grader or the judge gives.", ["kind", "giver"], registry=r)
        self.air_errors = Counter("rlproxy_air_errors_total",
                                  "Calls stored without their automatic rewards: AIR could not score them (stage "
                                  "score) or the database refused the rewards (stage store).", ["stage"], registry=r)
        self.reward_value = FinalRewards(r)
        self.eval_reward_value = EvalRewards(r)
        self.otlp_spans = Counter("rlproxy_otlp_spans_total",
                                  "Spans received on /v1/traces, by what became of them "
                                  "(proxy/otlp/span_rewards.py).",
                                  ["outcome"], registry=r)
        self.active_policy = Gauge("rlproxy_active_policy_version",
                                   "Version the default policy serves for the model (0: the base model).",
                                   registry=r)
        self.policy_version = Gauge("rlproxy_policy_active_version",
                                    "Version each named policy serves (0: the base model), and its canary.",
                                    ["policy", "role"], registry=r)
        self.passthrough = Counter("rlproxy_passthrough_requests_total",
                                   "Engine routes the proxy relays without recording (embeddings, tokenize, ...), "
                                   "by path and status.", ["path", "status"], registry=r)
        self.engine_up = Gauge("rlproxy_engine_up", "Whether an engine replica answers.", ["replica"], registry=r)
        self.fleet = FleetMetrics(r)  # what this proxy's retries of withheld replicas did
        self.out_of_rotation = Gauge("rlproxy_fleet_replica_out_of_rotation",
                                     "1 for each replica out of rotation for a version a named policy serves (active "
                                     "or canary): it could not load or verify it (engine/fleet.py).",
                                     ["policy", "replica"], registry=r)
        self.spooling = Gauge("rlproxy_capture_spooling",
                              "1 while calls wait in the spool because the database is down or too slow.",
                              registry=r)
        self.spool_fsync = Histogram("rlproxy_capture_spool_fsync_seconds", "Duration of one spool fsync.",
                                     buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
                                     registry=r)
        self.spool_fsync_calls = Histogram("rlproxy_capture_spool_fsync_calls",
                                           "Calls made durable by one spool fsync (group commit).",
                                           buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=r)

    def observe_policies(self, router) -> None:
        """What each named policy serves now (a proxy.policy.PolicyRouter): its active version and canary."""
        self.active_policy.set(router.active.version)
        for policy in {router.rules.default, *router.rules.policies(), *router.lines}:
            line = router.line(policy)
            self.policy_version.labels(policy, "active").set(line.active.version)
            self.policy_version.labels(policy, "canary").set(line.canary.version if line.canary else 0)
        self.out_of_rotation.clear()
        serving: set[int] = set()
        for policy, line in router.lines.items():
            for version in {p.version for p in (line.active, line.canary) if p is not None}:
                serving.add(version)
                for replica in router.withheld.get(version, {}):
                    self.out_of_rotation.labels(policy, replica).set(1)
        self.forget_versions(serving | {router.active.version})

    def forget_versions(self, serving: set[int]) -> None:
        """Remove the series of versions that neither serve nor are among the newest KEPT_VERSIONS (of those with
        a series): the one label that grows with every training step."""
        by_version = [(self.requests, ("route", "status", "policy")), (self.rewards, ("kind", "reason", "policy")),
                      *((metric, ("policy",)) for rewards in (self.reward_value, self.eval_reward_value)
                        for metric in (rewards.histogram, rewards.sum))]
        seen = {int(value) for metric, names in by_version for value in _label_values(metric, names[-1])
                if value.isdigit()}
        if len(seen) <= KEPT_VERSIONS:
            return
        keep = {str(v) for v in serving} | {str(v) for v in sorted(seen)[-KEPT_VERSIONS:]}
        for metric, names in by_version:
            for labels in _label_sets(metric, names):
                if labels[-1].isdigit() and labels[-1] not in keep:
                    metric.remove(*labels)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _label_sets(metric, names: tuple[str, ...]) -> set[tuple[str, ...]]:
    """The label values of each child of `metric` (read from what it exports: prometheus_client has no public
    list of children), in the order of `names`."""
    return {tuple(sample.labels[name] for name in names)
            for family in metric.collect() for sample in family.samples if all(n in sample.labels for n in names)}


def _label_values(metric, name: str) -> set[str]:
    return {labels[0] for labels in _label_sets(metric, (name,))}


class FinalRewards:
    """Final reward values by policy: a histogram, plus their sum as a gauge. prometheus_client drops a
    histogram's `_sum` when a bucket is below zero (a sum of negative values is no counter), and without it
    there is no mean: `sum(rlproxy_final_reward_sum) / sum(rlproxy_reward_value_count)` by policy gives it."""

    NAME, SUM = "rlproxy_reward_value", "rlproxy_final_reward_sum"
    WHAT = "Final reward values"

    def __init__(self, registry: CollectorRegistry) -> None:
        self.histogram = Histogram(self.NAME, f"{self.WHAT}.", ["policy"],
                                   buckets=REWARD_BUCKETS, registry=registry)
        self.sum = Gauge(self.SUM, f"Sum of {self.WHAT[0].lower()}{self.WHAT[1:]} (a gauge: rewards may be "
                         "negative).", ["policy"], registry=registry)

    def labels(self, policy: str) -> _FinalReward:
        return _FinalReward(self.histogram.labels(policy), self.sum.labels(policy))


class EvalRewards(FinalRewards):
    """Final rewards of evaluation rollouts (`rollouts.eval`), by the policy version that served them. The
    trainer exports the same two metrics for the rollouts it marks by agent name (`--eval-agents`)."""

    NAME, SUM = "rlproxy_eval_reward_value", "rlproxy_eval_reward_sum"
    WHAT = "Final reward values of evaluation rollouts"


class _FinalReward:
    def __init__(self, histogram, total) -> None:
        self.histogram, self.total = histogram, total

    def observe(self, value: float) -> None:
        self.histogram.observe(value)
        self.total.inc(value)
