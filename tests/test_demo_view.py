"""What the demo prints and draws at the end, from a run's progress (no engine needed)."""
from __future__ import annotations

import io
import re

from rich.console import Console

from demo.run import DemoSettings, Progress
from demo.view import LivePanel, heldout_rows, probe_periods, reward_curve, summary


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
    assert "77% of the last 30 probes" in text  # held-out probes so far


def test_the_live_panel_fits_a_small_terminal_with_the_base_model_and_the_newest_versions():
    progress = a_run()
    for i in range(60):  # 30 versions, two probes each
        progress.probes.append((1000.0 + i, 1.0, 4 + i // 2))
    progress.active = progress.steps = 33
    out = io.StringIO()
    Console(file=out, width=80, height=24).print(LivePanel(progress, DemoSettings(heldout=48)))
    lines = out.getvalue().rstrip("\n").split("\n")
    assert len(lines) <= 24 and max(len(line) for line in lines) <= 80
    versions = [line.split()[1] for line in lines if re.match(r"│  (base|v\d+) ", line)]
    assert versions[0] == "base" and versions[-1] == "v33"  # the reference, then the newest
    hidden = 34 - len(versions)
    assert any(f"{hidden} older versions not shown" in line for line in lines)
    tall = io.StringIO()
    Console(file=tall, width=120, height=45).print(LivePanel(progress, DemoSettings(heldout=48)))
    assert len(tall.getvalue().splitlines()) <= 45 and "v33" in tall.getvalue()
