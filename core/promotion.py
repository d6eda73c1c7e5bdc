"""The promotion rule every comparing gate decides with (the command gate, the demo's held-out gate, the
canary and eval-traffic gates): a candidate is promoted unless it is worse than what it is compared with by
more than `margin`.

A margin, not a strict "at least as good": 48 tasks at a success near 30% give a 95% interval about ±13 points
wide, so a strict rule would reject half of the candidates that are exactly as good as their parent.
"""
from __future__ import annotations


def promotes(score: float, parent_score: float, margin: float) -> bool:
    """Whether a candidate scoring `score` is promoted over a parent (or active version) scoring `parent_score`."""
    return score >= parent_score - margin
