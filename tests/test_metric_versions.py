"""Series labelled by a policy version stay bounded: each training step makes a version, and a series per version
kept for weeks grows every scrape. The versions that serve and the newest few keep theirs."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from proxy.metrics import KEPT_VERSIONS, ProxyMetrics


def versions_exported(metrics: ProxyMetrics, name: str) -> set[str]:
    families = text_string_to_metric_families(metrics.render().decode())
    return {s.labels["policy"] for f in families if f.name == name for s in f.samples if "policy" in s.labels}


def test_only_serving_and_recent_versions_keep_their_series():
    metrics = ProxyMetrics()
    for version in range(1, 41):  # forty training steps, each version answering and rewarded
        metrics.requests.labels("chat", "200", str(version)).inc()
        metrics.rewards.labels("air", "tool_error", str(version)).inc()
        metrics.reward_value.labels(str(version)).observe(1.0)
    metrics.requests.labels("chat", "200", "").inc()  # the base model asked for by name: no version
    metrics.forget_versions(serving={3, 40})  # v3 serves a named policy still; v40 the default

    kept = {"3", *(str(v) for v in range(41 - KEPT_VERSIONS, 41))}
    assert versions_exported(metrics, "rlproxy_requests") == kept | {""}
    assert versions_exported(metrics, "rlproxy_rewards") == kept
    assert versions_exported(metrics, "rlproxy_reward_value") == kept
    metrics.reward_value.labels("12").observe(0.5)  # a late reward for a retired version: counted again from 0
    assert "12" in versions_exported(metrics, "rlproxy_reward_value")
