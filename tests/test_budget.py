"""The suite's time-budget line (tests/budget.py): said once the budget is passed, naming the slowest tests."""
from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

from tests.budget import budget_line
from tests.support import ROOT


def report(nodeid: str, seconds: float) -> SimpleNamespace:
    return SimpleNamespace(nodeid=nodeid, duration=seconds)


def test_within_budget_nothing_is_said():
    assert budget_line(34 * 60, 35, [report("tests/test_a.py::test_x", 600)]) is None


def test_over_budget_one_line_names_the_ten_slowest_with_setup_call_and_teardown_added_up():
    reports = [report(f"tests/test_{i}.py::test_{i}", i) for i in range(1, 13)]
    reports += [report("tests/test_1.py::test_1", 100)]  # its setup: counted with its call
    line = budget_line(36 * 60, 35, reports)
    assert line.startswith("TIME BUDGET: the suite took 36.0 min, over its 35-minute budget")
    assert "\n" not in line
    named = line.split("slowest: ")[1].split(", ")
    assert len(named) == 10 and named[0] == "tests/test_1.py::test_1 (101 s)"
    assert "tests/test_2.py::test_2" not in line  # the 11th and 12th slowest are not named


def test_a_real_run_past_its_budget_ends_with_the_line_just_before_the_count(tmp_path):
    (tmp_path / "test_slow.py").write_text("import time\n\ndef test_sleeps():\n    time.sleep(0.2)\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.budget", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT,
                          env={**__import__("os").environ, "RLPROXY_TEST_BUDGET_MINUTES": "0.001"})
    assert done.returncode == 0, done.stdout
    *_, warning, closing = done.stdout.strip().splitlines()  # pytest's own count stays the closing line
    assert warning.startswith("TIME BUDGET:") and "test_slow.py::test_sleeps" in warning
    assert closing.startswith("1 passed")
