"""What the person running it sees: a rich progress bar (rate, success, ETA) in a terminal, time-stamped lines
otherwise; and the summary table at the end, success by split and by policy version."""
from __future__ import annotations

import re
import sys
import time
from collections import defaultdict

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from runner.attempt import Outcome

# C0 and C1 control characters: a task id is the task file's text, and ESC or CR in it would move this
# terminal's cursor, clear it, or forge a line of this log
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with each control character written as its escape (`\\x1b`)."""
    return CONTROL.sub(lambda found: f"\\x{ord(found.group()):02x}", text)


REASON_LIMIT = 200  # characters of an attempt's failure shown on its progress line (the log has all of it)


def reason(error: str) -> str:
    """Why an attempt failed, as one line of at most REASON_LIMIT characters: its error is the agent's own output
    (its exception, the last line of its standard error), so ESC, CR and newlines in it are written as escapes,
    never passed to the terminal."""
    shown = printable(error.strip())
    return shown if len(shown) <= REASON_LIMIT else shown[:REASON_LIMIT - 1] + "…"


class Display:
    def __init__(self, total: int, threshold: float, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.total, self.threshold = total, threshold
        self.done = self.successes = self.rewarded = 0
        self.began = time.monotonic()
        self._bar: Progress | None = None
        if self.console.is_terminal:
            self._bar = Progress(TextColumn("[bold]run"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[rate]}"), TextColumn("{task.fields[success]}"),
                                 TextColumn("ETA"), TimeRemainingColumn(), console=self.console)
            self._task = self._bar.add_task("run", total=total, rate="", success="")
            self._bar.start()

    def _rate(self) -> float:
        return self.done / max(time.monotonic() - self.began, 1e-9)

    def success_text(self) -> str:
        if not self.rewarded:
            return "success -"
        return f"success {self.successes / self.rewarded:.0%}"

    def advance(self, outcome: Outcome, label: str) -> None:
        self.done += 1
        if outcome.reward is not None:
            self.rewarded += 1
            self.successes += outcome.reward >= self.threshold
        rate = self._rate()
        # why it failed, on screen as well as in the log: "exit status 1: ModuleNotFoundError: No module named ..."
        why = f": {reason(outcome.error)}" if outcome.error and outcome.reward is None else ""
        if outcome.claims:  # the runner gives this attempt's reward; its agent posted one anyway
            why += f" ({claimed(outcome.claims)})"
        if self._bar is not None:
            if why:  # the bar shows only counts: a failed attempt's line goes above it
                self._print(f"{printable(label)} {outcome.status}{why}")
            self._bar.update(self._task, advance=1, rate=f"{rate:.2f}/s", success=self.success_text())
            return
        left = (self.total - self.done) / rate if rate > 0 else float("inf")
        reward = "" if outcome.reward is None else f" reward {outcome.reward:g}"
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        print(f"{stamp} {self.done}/{self.total} {printable(label)} {outcome.status}{reward}{why} | {rate:.2f}/s "
              f"{self.success_text()} ETA {left:.0f}s", file=sys.stderr, flush=True)

    def note(self, text: str) -> None:
        """A line about the run itself (not an attempt): above the bar, or time-stamped like the others."""
        if self._bar is not None:
            self._print(text)
            return
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        print(f"{stamp} {text}", file=sys.stderr, flush=True)

    def _print(self, text: str) -> None:
        """A line above the bar, as it is: no rich markup, highlighting or emoji codes read in it."""
        self._bar.console.print(text, markup=False, highlight=False, emoji=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def claimed(count: int) -> str:
    return f"its agent posted {count} reward{'s' if count > 1 else ''} of its own: kept as claims, not the reward"


def claims_caption(outcomes: list[Outcome]) -> str | None:
    """The summary's line on attempts whose agent posted a reward the runner gives (kept as claims)."""
    posted = sum(1 for o in outcomes if o.claims)
    if not posted:
        return None
    return (f"{posted} attempt{'s' if posted > 1 else ''}' agents posted a reward of their own where the runner "
            "gives it (--verify, evaluation): kept as claims, never trained on")


def _row_order(row: tuple[tuple[str, str], list[Outcome]]) -> tuple[str, bool, int]:
    """By split, then by version number (v2 before v10), "-" (no call answered) first and "all" last."""
    split, version = row[0]
    return split, version == "all", int(version[1:]) if version[1:].isdigit() else -1


def summary(outcomes: list[Outcome], threshold: float) -> Table:
    """Attempts, rewarded, success and mean reward, by split and by the policy version that answered."""
    groups: dict[tuple[str, str], list[Outcome]] = defaultdict(list)
    for outcome in outcomes:
        version = "-" if outcome.policy is None else f"v{outcome.policy}"
        groups[(outcome.split, version)].append(outcome)
        groups[(outcome.split, "all")].append(outcome)
    table = Table(title=f"rlproxy run: success is a reward >= {threshold:g}", caption=claims_caption(outcomes))
    for column in ("split", "policy", "attempts", "rewarded", "success", "mean reward", "failed"):
        table.add_column(column, justify="left" if column in ("split", "policy") else "right")
    versions = defaultdict(int)
    for split, version in groups:
        versions[split] += version != "all"
    for (split, version), items in sorted(groups.items(), key=_row_order):
        if version == "all" and versions[split] == 1:
            continue  # the one version's row says it all
        rewards = [o.reward for o in items if o.reward is not None]
        wins = sum(r >= threshold for r in rewards)
        table.add_row(split, version, str(len(items)), str(len(rewards)),
                      f"{wins / len(rewards):.0%}" if rewards else "-",
                      f"{sum(rewards) / len(rewards):.3f}" if rewards else "-",
                      str(sum(o.status in ("failed", "timeout", "infrastructure") for o in items)))
    return table
