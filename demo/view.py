"""What the demo shows: a live panel while it runs (fitted to the terminal; demo/report.py draws it), then a
table of held-out success per version and a PNG reward curve."""
from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from store.evaluation import wilson

PANEL_TITLE = "rlproxy demo — a tool-using agent learning from its own traffic"


def _clock(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def _head(progress, settings) -> Table:
    """Two columns of label/value pairs: fits 80 columns without wrapping."""
    running = time.monotonic() - (progress.run_started or progress.started)
    rate = progress.episodes / (running / 60) if running > 0 else 0.0
    head = Table.grid(padding=(0, 2))
    serving = (f"v{progress.active}" if progress.active else "the base model") + \
        (f" ({progress.steps} new versions)" if progress.steps else "")
    shown = min(running / 60, settings.minutes)  # past it, in-flight episodes finish: the run is over
    head.add_row("running", f"{shown:4.1f} of {settings.minutes:g} min", "serving", serving)
    head.add_row("episodes", f"{progress.episodes} ({rate:.1f}/min)", "train reward",
                 f"{progress.recent_reward():.2f} (last 64)")
    recent = progress.recent_probe_success()
    if recent is not None:
        head.add_row("held-out", f"{recent[0]:.0%} of the last {recent[1]} probes", "", "")
    return head


def _activity(progress) -> Text | None:
    """What is slow right now, if anything: a training step (the agents wait for it)."""
    if progress.training_since is None:
        return None
    return Text(f"training a step: {_clock(time.monotonic() - progress.training_since)} (the agents wait for it)",
                style="cyan", no_wrap=True, overflow="ellipsis")


def _panel(progress, settings, rows: int | None = None, activity: RenderableType | None = None) -> Panel:
    """The live panel with at most `rows` version rows (the newest); `activity`: a line about what runs now."""
    event = Text(progress.last_event, style="dim", no_wrap=True, overflow="ellipsis")
    parts = [_head(progress, settings), heldout_table(progress, settings, rows=rows, compact=True), event]
    activity = activity if activity is not None else _activity(progress)
    if activity is not None:
        parts.append(activity)
    return Panel(Group(*parts), title=PANEL_TITLE)


class LivePanel:
    """The panel fitted to the terminal: as many of the newest versions as the height leaves room for (a
    panel taller than the screen cannot be redrawn in place: each redraw would leave a copy behind)."""

    def __init__(self, progress, settings, activity: RenderableType | None = None) -> None:
        self.progress, self.settings, self.activity = progress, settings, activity

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        height = options.height or options.size.height
        total = len(heldout_rows(self.progress, self.settings))
        rows = total
        while True:
            panel = _panel(self.progress, self.settings, rows=rows, activity=self.activity)
            lines = len(console.render_lines(panel, options.update(height=None), pad=False))
            if lines <= height or rows <= 1:
                break
            caption = 1 if rows == total else 0  # leaving rows out adds the line that says so
            rows = max(1, min(rows - 1, rows - (lines - height) - caption))
        yield panel


def heldout_rows(progress, settings) -> dict[int, tuple[int, int]]:
    """version -> (held-out successes, episodes): a full evaluation (the base model's, or every candidate's
    with gate=heldout) plus the held-out probes the version served."""
    rows: dict[int, tuple[int, int]] = {}
    for version, success in progress.heldout.items():
        rows[version] = (round(success * settings.heldout), settings.heldout)
    for version, (success, n) in progress.probe_success().items():
        wins, total = rows.get(version, (0, 0))
        rows[version] = (wins + round(success * n), total + n)
    return dict(sorted(rows.items()))


def _base_rate(rows: dict[int, tuple[int, int]]) -> float | None:
    wins, n = rows.get(0, (0, 0))
    return wins / n if n else None


def heldout_table(progress, settings, rows: int | None = None, compact: bool = False) -> Table:
    """Held-out success per version. `rows`: at most that many (the base model and the newest), with a caption
    saying how many are left out; `compact`: no outer border lines (the live panel's)."""
    table = Table(title="held-out success by policy version", expand=False,
                  box=box.SIMPLE_HEAD if compact else box.HEAVY_HEAD, show_edge=not compact)
    for name in ("version", "held-out success", "episodes", "95% interval", "vs base", "status"):
        table.add_column(name, justify="left" if name in ("version", "status") else "right")
    measured = heldout_rows(progress, settings)
    base_rate = _base_rate(measured)
    shown = list(measured.items())
    if rows is not None and len(shown) > rows:  # the base model (what the rest is compared to), then the newest
        table.caption = f"{len(shown) - rows} older versions not shown"
        keep_base = shown[0][0] == 0 and rows > 1
        shown = shown[:1] * keep_base + shown[len(shown) - rows + keep_base:]
    for version, (wins, n) in shown:
        rate = wins / n if n else 0.0
        low, high = wilson(wins, n)
        delta = "" if base_rate is None or version == 0 else f"{(rate - base_rate) * 100:+.0f} pts"
        status = "serving" if version == progress.active else ""
        table.add_row("base" if version == 0 else f"v{version}", f"{rate:.0%}", str(n), f"{low:.0%}-{high:.0%}",
                      delta, status)
    return table


def probe_periods(progress, parts: int = 3) -> list[tuple[float, float, list[int], int, int]]:
    """The run cut into `parts` equal stretches of time from the first probe on: (from min, to min, versions
    served, successes, probes) each. Single versions serve too briefly to score alone; stretches can."""
    if not progress.probes:
        return []
    first, last = progress.probes[0][0], progress.probes[-1][0]
    width = max((last - first) / parts, 1e-9)
    periods = []
    for i in range(parts):
        low, high = first + i * width, first + (i + 1) * width
        inside = [(r, v) for t, r, v in progress.probes if low <= t < high or (i == parts - 1 and t == high)]
        periods.append((low / 60, high / 60, sorted({v for _, v in inside}), round(sum(r for r, _ in inside)),
                        len(inside)))
    return periods


def summary(progress, settings, console: Console | None = None) -> None:
    console = console or Console()
    console.print(heldout_table(progress, settings))
    rows = heldout_rows(progress, settings)
    base_rate = _base_rate(rows)
    for low, high, versions, wins, n in probe_periods(progress):
        if not n:
            continue
        lo, hi = wilson(wins, n)
        served = f"v{versions[0]}" + (f"-v{versions[-1]}" if len(versions) > 1 else "")
        delta = "" if base_rate is None else f", {(wins / n - base_rate) * 100:+.0f} points vs base"
        console.print(f"held-out probes, minutes {low:4.1f}-{high:4.1f} ({served}): {wins / n:.0%} of {n} "
                      f"(95% {lo:.0%}-{hi:.0%}){delta}")
    recent = progress.recent_probe_success()
    if base_rate is not None and recent is not None:
        console.print(f"held-out success: base {base_rate:.0%} -> last {recent[1]} probes {recent[0]:.0%} "
                      f"({(recent[0] - base_rate) * 100:+.0f} points), {progress.episodes} training episodes, "
                      f"{progress.steps} versions")
    elif base_rate is not None:
        best = max((wins / n for v, (wins, n) in rows.items() if v != 0 and n), default=None)
        if best is not None:
            console.print(f"held-out success: base {base_rate:.0%} -> best {best:.0%} "
                          f"({(best - base_rate) * 100:+.0f} points), {progress.episodes} episodes")


def rolling(values: list[float], window: int, warmup: int = 8) -> list[float]:
    """Mean of the last `window` values; NaN (not drawn) until `warmup` values exist: a mean of two is noise."""
    return [statistics.fmean(values[max(0, i - window + 1): i + 1]) if i + 1 >= min(warmup, window) else math.nan
            for i in range(len(values))]


def reward_curve(progress, path: Path, window: int = 32) -> Path | None:
    """Training reward (rolling mean) over time, with held-out success per version; written as PNG."""
    if not progress.rewards:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times = [t / 60 for t, _, _ in progress.rewards]
    training = rolling([r for _, r, _ in progress.rewards], window)
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    ax.plot(times, training, label=f"training episodes (mean of last {window})")
    if progress.probes:
        probe_times = [t / 60 for t, _, _ in progress.probes]
        probe_rolling = rolling([r for _, r, _ in progress.probes], window)
        ax.plot(probe_times, probe_rolling, label=f"held-out probes (mean of last {window})")
    if 0 in progress.heldout:
        ax.axhline(progress.heldout[0], linestyle="--", color="grey", label="base model, held-out")
    evaluated = [v for k, v in progress.heldout.items() if k != 0]  # full evaluations (gate=heldout)
    if evaluated:
        ax.axhline(max(evaluated), linestyle=":", color="green", label=f"best version, held-out ({max(evaluated):.0%})")
    ax.set_xlabel("minutes")
    ax.set_ylabel("reward / success")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(loc="lower right")
    ax.set_title("rlproxy demo: reward while training live")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
