"""Bounded ingest of rewards and rollout events, and rollouts read back in pages: what agents report and read
back cannot make the proxy do unbounded work, what is refused is refused before the work, and what is kept
stays; meanwhile another project's calls are served as before (tests/bounded.py)."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from store.rollout_view import PAGE_BYTES
from tests.bounded import (
    MAX_EVENTS,
    MAX_REWARDS_PER_CALL,
    Proxy,
    add_calls,
    assert_victim_unharmed,
    bounded_proxy,
    error,
    under_attack,
)


@pytest.fixture(scope="module")
def proxy(stub_url, postgres_server, run_dir) -> Iterator[Proxy]:
    with bounded_proxy(stub_url, postgres_server, run_dir) as running:
        yield running


# --- rewards -------------------------------------------------------------------------------------------------


def test_a_call_keeps_at_most_its_budget_of_posted_rewards_and_the_earlier_ones(proxy: Proxy):
    rollout_id = proxy.rollout()
    call_id = proxy.chat(proxy.alpha, rollout_id).headers["X-Rlproxy-Call-Id"]

    def reward(value: float) -> requests.Response:
        return requests.post(f"{proxy.url}/reward", json={"rollout_id": rollout_id, "call_id": call_id,
                                                          "reward": value}, headers=proxy.headers(proxy.alpha))

    for number in range(MAX_REWARDS_PER_CALL):
        assert reward(number).status_code == 200
    assert "--max-rewards-per-call" in error(reward(9), 413, "too_many_rewards")
    statuses, latencies = under_attack(proxy, lambda: reward(9), seconds=2)
    assert set(statuses) == {413}
    assert_victim_unharmed(latencies)
    rewards = proxy.read(rollout_id).json()["rewards"]
    assert [r["value"] for r in rewards] == list(range(MAX_REWARDS_PER_CALL))


# --- rollout events ------------------------------------------------------------------------------------------


def post_event(proxy: Proxy, rollout_id: str, data, event_type: str = "span") -> requests.Response:
    return requests.post(f"{proxy.url}/rollouts/{rollout_id}/events", json={"event_type": event_type, "data": data},
                         headers=proxy.headers(proxy.alpha), timeout=60)


def test_events_past_the_rollouts_budget_are_refused_and_the_earlier_ones_kept(proxy: Proxy):
    rollout_id = proxy.rollout()
    for number in range(MAX_EVENTS):
        assert post_event(proxy, rollout_id, {"n": number}).json() == {
            "rollout_id": rollout_id, "event_type": "span", "reward": None, "stored": True}
    message = error(post_event(proxy, rollout_id, {"n": MAX_EVENTS}), 413, "too_many_events")
    assert f"holds {MAX_EVENTS} events" in message and "--max-rollout-events" in message
    statuses, latencies = under_attack(proxy, lambda: post_event(proxy, rollout_id, {"n": -1}), seconds=2)
    assert set(statuses) == {413}
    assert_victim_unharmed(latencies)
    # A reward event is the final reward, not an event: still taken.
    assert post_event(proxy, rollout_id, {"value": 1.0}, "reward").json()["reward"] == 1.0
    kept = proxy.read(rollout_id).json()["metadata"]["events"]
    assert [event["data"] for event in kept] == [{"n": number} for number in range(MAX_EVENTS)]


def test_an_event_larger_than_the_budget_is_refused_before_it_is_read(proxy: Proxy):
    """1 MiB events used to be kept, each rewriting the rollout's whole metadata."""
    rollout_id = proxy.rollout()
    big = {"blob": "x" * (1 << 20)}
    message = error(post_event(proxy, rollout_id, big), 413, "event_too_large")
    assert "65536" in message and "--max-event-bytes" in message
    statuses, latencies = under_attack(proxy, lambda: post_event(proxy, rollout_id, big))
    assert set(statuses) == {413}
    assert_victim_unharmed(latencies)
    assert post_event(proxy, rollout_id, {"blob": "x" * 60_000}).status_code == 200
    assert [e["data"]["blob"][:1] for e in proxy.read(rollout_id).json()["metadata"]["events"]] == ["x"]


def test_a_large_rollout_reads_back_in_pages_with_every_call_once(proxy: Proxy):
    rollout_id = proxy.rollout()
    written = add_calls(proxy.database_url, rollout_id, 2_300, 20_000)

    first = proxy.read(rollout_id)  # no parameters: the first page (8 MiB of 20 kB calls) and where to go on
    assert first.status_code == 200, first.text
    assert len(first.content) < PAGE_BYTES + 2**20
    pages, page = [first.json()], first.json()
    assert 300 < len(page["calls"]) < 1_000 and page["next"] == page["calls"][-1]["seq"]
    while page["next"] is not None:
        page = proxy.read(rollout_id, after=page["next"], limit=100).json()  # ?limit= bounds a page further
        pages.append(page)
    assert all(len(p["calls"]) == 100 for p in pages[1:-1]) and 0 < len(pages[-1]["calls"]) <= 100
    assert [c["call_id"] for p in pages for c in p["calls"]] == written

    statuses, latencies = under_attack(proxy, lambda: proxy.read(rollout_id), seconds=6, attackers=1)
    assert set(statuses) == {200}
    assert_victim_unharmed(latencies)


def test_a_small_rollout_reads_back_whole_as_before(proxy: Proxy):
    rollout_id = proxy.rollout()
    call_ids = [proxy.chat(proxy.alpha, rollout_id).headers["X-Rlproxy-Call-Id"] for _ in range(3)]
    whole = proxy.read(rollout_id).json()
    assert [c["call_id"] for c in whole["calls"]] == call_ids and whole["next"] is None
    assert [c["call_id"] for c in proxy.read(rollout_id, limit=2).json()["calls"]] == call_ids[:2]


@pytest.mark.parametrize("query, param", [({"limit": 0}, "limit"), ({"limit": 1001}, "limit"),
                                          ({"limit": "ten"}, "limit"), ({"after": -1}, "after")])
def test_a_page_outside_the_bounds_is_a_422_naming_the_parameter(proxy: Proxy, query, param):
    response = requests.get(f"{proxy.url}/rollouts/{proxy.rollout()}", params=query,
                            headers=proxy.headers(proxy.alpha), timeout=30)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == param
