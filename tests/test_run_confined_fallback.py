"""Where the kernel has no Landlock, `rlproxy run` says once that its agents run unconfined and why, and
`--require-confinement` refuses to start instead (runner/confine.py); no kernel without it is needed to check."""
from __future__ import annotations

import logging
import re

import pytest

from runner import confine
from runner.errors import RunInputError

OLD_KERNEL = "the kernel has no Landlock (Linux 5.13 or later, built with CONFIG_SECURITY_LANDLOCK)"


@pytest.fixture
def no_landlock(monkeypatch):
    monkeypatch.setattr(confine.landlock, "abi", lambda: (0, OLD_KERNEL))
    yield
    confine.stop()


def test_without_landlock_agents_run_unconfined_and_the_run_says_why(no_landlock, caplog):
    with caplog.at_level(logging.WARNING, logger="rlproxy.run"):
        assert confine.start(["/nonexistent/run.jsonl"]) == (False, OLD_KERNEL)
    assert confine.active() is None and confine.ruleset_for("true", {}, None) == (None, {})
    assert [record.getMessage() for record in caplog.records] == [
        f"agents run unconfined: {OLD_KERNEL}; they can read what this user can (the journal, the task files)"]


def test_require_confinement_refuses_where_there_is_none(no_landlock):
    with pytest.raises(RunInputError, match=re.escape(f"agents cannot be confined here: {OLD_KERNEL}")):
        confine.start([], required=True)
