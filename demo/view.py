"""What the demo shows: a live panel while it runs, then a table of held-out success per version and a PNG
reward curve."""
from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table


def _panel(progress, settings) -> Panel:
    elapsed = time.monotonic() - progress.started
    rate = progress.episodes / (elapsed / 60) if elapsed > 0 else 0.0
    head = Table.grid(padding=(0, 2))
    head.add_row("elapsed", f"{elapsed / 60:5.1f} / {settings.minutes:g} min", "episodes", str(progress.episodes),
                 "episodes/min", f"{rate:5.1f}")
    head.add_row("serving", f"v{progress.active}", "train reward (last 64)", f"{progress.recent_reward():.2f}",
                 "versions", str(progress.steps))
    return Panel(Group(head, heldout_table(progress), f"[dim]{progress.last_event}[/dim]"),
                 title="rlproxy demo — a tool-using agent learning from its own traffic")


def heldout_table(progress) -> Table:
    table = Table(title="held-out success by policy version", expand=False)
    table.add_column("version")
    table.add_column("held-out success", justify="right")
    table.add_column("vs base", justify="right")
    table.add_column("status")
    base = progress.heldout.get(0)
    for version in sorted(progress.heldout):
        success = progress.heldout[version]
        delta = "" if base is None or version == 0 else f"{(success - base) * 100:+.0f} pts"
        status = "serving" if version == progress.active else ""
        table.add_row("base" if version == 0 else f"v{version}", f"{success:.0%}", delta, status)
    return table


@contextlib.asynccontextmanager
async def live_view(progress, settings, *, enabled: bool = True):
    if not enabled:
        yield
        return
    console = Console(stderr=True)
    with Live(_panel(progress, settings), console=console, refresh_per_second=2, transient=False) as live:
        async def refresh() -> None:
            while True:
                live.update(_panel(progress, settings))
                await asyncio.sleep(0.5)

        task = asyncio.create_task(refresh())
        try:
            yield
        finally:
            task.cancel()
            live.update(_panel(progress, settings))


def summary(progress, settings, console: Console | None = None) -> None:
    console = console or Console()
    console.print(heldout_table(progress))
    base = progress.heldout.get(0)
    best = max((v for k, v in progress.heldout.items() if k != 0), default=None)
    if base is not None and best is not None:
        console.print(f"held-out success: base {base:.0%} -> best {best:.0%} ({(best - base) * 100:+.0f} points), "
                      f"{progress.episodes} episodes")


def reward_curve(progress, path: Path, window: int = 32) -> Path | None:
    """Training reward (rolling mean) over time, with held-out success per version; written as PNG."""
    if not progress.rewards:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times = [t / 60 for t, _, _ in progress.rewards]
    values = [r for _, r, _ in progress.rewards]
    rolling = [statistics.fmean(values[max(0, i - window + 1): i + 1]) for i in range(len(values))]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    ax.plot(times, rolling, label=f"training episodes (mean of last {window})")
    if progress.heldout:
        ax.axhline(progress.heldout.get(0, 0.0), linestyle="--", color="grey", label="base model, held-out")
        best = max(progress.heldout.values())
        ax.axhline(best, linestyle=":", color="green", label=f"best version, held-out ({best:.0%})")
    ax.set_xlabel("minutes")
    ax.set_ylabel("reward / success")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(loc="lower right")
    ax.set_title("rlproxy demo: reward while training live")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
