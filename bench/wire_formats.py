"""Cells of bench/load.py against a baseline's, round by round, with a noise estimate, against a bound of 0.2 ms:
the Responses and Messages cells against chat's on the same proxy process (what the translation costs), and the
durability modes against `batch` (what recording each call in the spool before its answer costs)."""
from __future__ import annotations

import math
import statistics

BOUND_MS = 0.2  # how far the Responses and Messages p50 may be from chat's (the proxy's translation costs)


def print_wire_formats(cell: dict, stream: bool, apis: dict[str, str], base: str = "rlproxy-batch",
                       title: str = "wire format on rlproxy-batch: p50 minus chat's") -> None:
    """The p50 of each target in `apis` (name: column title) minus `base`'s, round by round (the stub's p50
    cancels out): by default the Responses and Messages p50 minus chat's on the same rlproxy-batch process. The
    median of those differences, an interval that holds the true median with the confidence shown whatever the
    noise's distribution, and whether the bound holds (`yes`: the whole interval is within it; `no`: the whole
    interval is outside; `unsure`: the noise is too large to tell)."""
    others = [name for name in apis if any(key[0] == name for key in cell)]
    levels = sorted({key[2] for key in cell if key[0] == base and key[1] == stream})
    if not others or not levels:
        return
    rounds = len(cell[(base, stream, levels[0])]["round_p50"])
    confidence = median_interval(list(range(rounds)))[2]
    print(f"{title} in the same round, ms; median of {rounds} rounds [{confidence:.0%} interval]; "
          f"within {BOUND_MS} ms?")
    print(f"{'conc':>5}" + "".join(f"{apis[name]:>34}" for name in others))
    for level in levels:
        chat = cell[(base, stream, level)]["round_p50"]
        line = f"{level:>5}"
        for name in others:
            row = cell.get((name, stream, level))
            deltas = [d for d in (mine - theirs for mine, theirs in zip(row["round_p50"], chat))
                      if not math.isnan(d)] if row else []
            if not deltas:
                line += f"{'n/a':>34}"
                continue
            low, high, _ = median_interval(deltas)
            verdict = ("yes" if -BOUND_MS <= low and high <= BOUND_MS
                       else "no" if low > BOUND_MS or high < -BOUND_MS else "unsure")
            line += f"{f'{statistics.median(deltas):+.2f} [{low:+.2f}, {high:+.2f}] {verdict}':>34}"
        print(line)


def median_interval(values: list[float]) -> tuple[float, float, float]:
    """A confidence interval for the median of `values` from their order statistics alone (the sign test):
    the k-th smallest and k-th largest, for the largest k whose interval still has at least 95% confidence
    (k = 1, the whole range, when there are too few values for 95%); and that interval's confidence."""
    ordered = sorted(values)
    n = len(ordered)
    below = [math.comb(n, i) / 2 ** n for i in range(n + 1)]  # P(exactly i of n values lie below the median)
    k = 1
    while k < n // 2 and 1 - 2 * sum(below[:k + 1]) >= 0.95:
        k += 1
    return ordered[k - 1], ordered[n - k], 1 - 2 * sum(below[:k])
