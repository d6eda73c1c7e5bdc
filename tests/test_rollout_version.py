"""Which version a running rollout's calls get when a new one starts serving (`--rollout-version-hold`,
proxy/policy/pins.py): the newest at once (on-policy, the default), or for a while the version its first call got
(the engine's prefix cache, kept per adapter, still holds its context), read by the proxy's router from the store."""
from __future__ import annotations

import pytest

from core.settings import ProxySettings
from proxy.policy import PolicyRouter, Route
from proxy.policy.pins import RolloutPins
from store import policies
from store.db import open_database, session_factory
from store.policies import ActivePolicy
from tests.support import add_policies, transaction

BASE = "stub-model"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_running_rollout_keeps_its_version_for_the_hold_and_a_new_one_gets_the_newest(
        own_database_url, tmp_path):
    names = await add_policies(own_database_url, tmp_path, [1, 2], active=1)
    database = open_database(own_database_url)
    try:
        held = PolicyRouter(session_factory(database), BASE,
                            ProxySettings(rollout_version_hold=25, served_model=BASE).routing())
        newest = PolicyRouter(session_factory(database), BASE)  # the default: no hold
        held.pins.clock = clock = Clock()
        for router in (held, newest):
            await router.refresh()
            assert router.route(BASE, "running") == Route(names[1], 1, "default")
            assert router.version_for_new("started-before", False, None) == 1  # POST /rollouts pins it too

        async with transaction(own_database_url) as session:
            await policies.activate(session, 2)
        for router in (held, newest):
            await router.refresh()
        assert newest.route(BASE, "running") == Route(names[2], 2, "default")  # on-policy: moves at once
        clock.now += 20
        await held.refresh()
        assert held.route(BASE, "running") == Route(names[1], 1, "default")  # its context still cached
        assert held.version_for("started-before") == 1
        assert held.route(BASE, "new") == Route(names[2], 2, "default")  # a rollout started now: the newest
        assert held.route(BASE) == Route(names[2], 2, "default")  # a call without a rollout: the newest

        clock.now += 6  # v1 stopped serving 26 s ago: past the hold, so it moves (and the engines may unload v1)
        await held.refresh()
        assert held.route(BASE, "running") == Route(names[2], 2, "default")
        async with transaction(own_database_url) as session:  # a rollback to v1: it serves again
            await policies.activate(session, 1)
        await held.refresh()
        assert held.route(BASE, "running") == Route(names[2], 2, "default")  # v2 is held for it now
        assert held.route(BASE, "another") == Route(names[1], 1, "default")
    finally:
        await database.dispose()


def test_a_rollout_that_started_on_a_version_still_serving_stays_there():
    """A canary would answer the rollout now, but it started on the active version, which still serves: it stays
    (one rollout, one version), and so does one held per policy, apart from another policy's versions."""
    clock = Clock()
    pins = RolloutPins(30, clock=clock)
    active, canary = ActivePolicy(3, "v3", None, "default"), ActivePolicy(4, "v4", None, "default")
    pins.serving({("default", 3), ("coder", 0)})
    assert pins.keep("r", "default", active) == active
    assert pins.keep("r", "coder", ActivePolicy(0, None, None, "coder")).version == 0
    pins.serving({("default", 3), ("default", 4), ("coder", 5)})
    clock.now += 3600
    assert pins.keep("r", "default", canary) == active  # still serving: however long
    assert pins.keep("r", "coder", ActivePolicy(5, "v5", None, "coder")).version == 5  # base 0 stopped an hour ago
    assert RolloutPins(0).keep("r", "default", canary) == canary  # no hold: whatever serves it now
    assert pins.keep(None, "default", canary) == canary


def test_the_hold_is_a_proxy_setting_of_seconds():
    assert ProxySettings().routing().version_hold == 0  # the default: on-policy
    assert ProxySettings(rollout_version_hold=12.5).routing().version_hold == 12.5
    with pytest.raises(ValueError, match="rollout_version_hold"):
        ProxySettings(rollout_version_hold=-1)
