"""Pytest plugin: the suite's time budget, said where a change pushes it over.

CI gives a run 90 minutes, the install included; the suite aims to finish within 35 of them so that machines
slower than ours still land. This plugin adds one line at the end of the summary (just before pytest's closing count) when the suite's own
time passed `RLPROXY_TEST_BUDGET_MINUTES` (35 by default), naming the ten slowest tests. It is a warning, not
a failure: machines differ, and the line is for whoever made the suite slower to see it in their own run.
"""
from __future__ import annotations

import os
import time
from collections import defaultdict

import pytest

BUDGET_ENV = "RLPROXY_TEST_BUDGET_MINUTES"
DEFAULT_BUDGET_MINUTES = 35.0

_started = time.monotonic()


def slowest(reports, count: int = 10) -> list[tuple[str, float]]:
    """The `count` tests that took longest, setup, call and teardown together."""
    spent: dict[str, float] = defaultdict(float)
    for report in reports:
        spent[report.nodeid] += getattr(report, "duration", 0.0)
    return sorted(spent.items(), key=lambda item: item[1], reverse=True)[:count]


def budget_line(elapsed_s: float, budget_minutes: float, reports) -> str | None:
    """The warning, or None within budget."""
    if elapsed_s <= budget_minutes * 60:
        return None
    named = ", ".join(f"{nodeid} ({seconds:.0f} s)" for nodeid, seconds in slowest(reports))
    return (f"TIME BUDGET: the suite took {elapsed_s / 60:.1f} min, over its {budget_minutes:g}-minute budget "
            f"(CI allows 90 with the install); slowest: {named}")


def pytest_sessionstart(session: pytest.Session) -> None:
    global _started
    _started = time.monotonic()


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    budget = float(os.environ.get(BUDGET_ENV, DEFAULT_BUDGET_MINUTES))
    reports = [report for kind in ("passed", "failed", "error", "skipped")
               for report in terminalreporter.stats.get(kind, []) if hasattr(report, "nodeid")]
    line = budget_line(time.monotonic() - _started, budget, reports)
    if line:
        terminalreporter.write_line(line, yellow=True, bold=True)
