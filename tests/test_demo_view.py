"""What the demo prints and draws at the end, from a run's progress (no engine needed)."""
from __future__ import annotations

import io

from rich.console import Console

from demo.run import DemoSettings, Progress
from demo.view import heldout_rows, probe_periods, reward_curve, summary


def a_run() -> Progress:
    """Base measured on 48 tasks (12 right); then 30 probes over 15 minutes that get better with the version."""
    progress = Progress(started=0.0, heldout={0: 0.25}, active=3, steps=3, episodes=90)
    for i in range(30):
        version = i // 10 + 1
        progress.probes.append((60.0 + i * 30, 1.0 if i % 10 < 2 + 3 * version else 0.0, version))
        progress.rewards.append((60.0 + i * 30, 1.0 if i % 2 else 0.0, version))
    return progress


def test_rows_merge_the_full_evaluation_with_the_probes_each_version_served():
    rows = heldout_rows(a_run(), DemoSettings(heldout=48))
    assert rows == {0: (12, 48), 1: (5, 10), 2: (8, 10), 3: (10, 10)}


def test_periods_split_the_probes_by_time_and_name_the_versions_served():
    periods = probe_periods(a_run(), parts=3)
    assert [(versions, wins, n) for _, _, versions, wins, n in periods] == [([1], 5, 10), ([2], 8, 10), ([3], 10, 10)]


def test_summary_reports_the_gain_over_base_and_the_curve_is_drawn(tmp_path):
    out = io.StringIO()
    summary(a_run(), DemoSettings(heldout=48), Console(file=out, width=120))
    text = out.getvalue()
    assert "+75 points vs base" in text  # the last stretch: 10 of 10 against 25%
    assert "held-out success: base 25% -> last 30 probes 77% (+52 points)" in text
    path = reward_curve(a_run(), tmp_path / "curve.png")
    assert path is not None and path.stat().st_size > 10_000


def test_the_live_panel_shows_the_serving_version_and_the_recent_probes():
    from demo.view import _panel

    out = io.StringIO()
    Console(file=out, width=120).print(_panel(a_run(), DemoSettings(heldout=48)))
    text = out.getvalue()
    assert "serving" in text and "v3" in text
    assert "77% of last 30" in text  # held-out probes so far
