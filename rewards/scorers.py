"""Outcome scorers an agent can use for its final reward. Each returns 1.0 (match) or 0.0."""
from __future__ import annotations

import math
import re

from core.checks import loads_strict

# Sentence punctuation a model tends to append to an answer ("Paris." for "Paris").
_TRAILING_PUNCTUATION = ".,;:!?…。"

# A number: optional sign (ASCII or Unicode minus, only when not glued to a preceding word or number,
# so "5-7" ends in 7, not -7), digits with optional thousands commas, optional decimals and exponent.
_NUMBER = re.compile(
    r"(?:(?<![\w\-−])[-−+])?"
    r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?"
    r"|(?:(?<![\w\-−])[-−+])?(?<![\d.])\.\d+(?:[eE][-+]?\d+)?"
)


def _normalize_text(text: str) -> str:
    """strip -> casefold -> drop trailing punctuation -> collapse whitespace."""
    text = text.strip().casefold().rstrip(_TRAILING_PUNCTUATION).strip()
    return " ".join(text.split())


def exact_match(answer: str | None, expected: str, *, normalize: bool = True) -> float:
    """1.0 if answer equals expected.

    With normalize, both sides are stripped, casefolded, cleared of trailing sentence punctuation and
    have whitespace runs collapsed first: "  Paris. " matches "paris".
    """
    if answer is None:
        return 0.0
    if normalize:
        return float(_normalize_text(answer) == _normalize_text(expected))
    return float(answer == expected)


def last_number(text: str) -> float | None:
    """The last number in `text` ("1,234.5" -> 1234.5, "-3" -> -3.0), or None if it has none."""
    matches = _NUMBER.findall(text)
    if not matches:
        return None
    return float(matches[-1].replace(",", "").replace("−", "-"))


def numeric_match(answer: str | None, expected: float | str, tol: float = 1e-6) -> float:
    """1.0 if |last_number(answer) - expected| <= tol. A string `expected` is read with last_number too."""
    if not tol >= 0:
        raise ValueError(f"tol must be >= 0, got {tol}")
    if isinstance(expected, str):
        target = last_number(expected)
        if target is None:
            raise ValueError(f"expected answer {expected!r} contains no number")
    else:
        target = float(expected)
    if not math.isfinite(target):
        raise ValueError(f"expected answer must be finite, got {expected!r}")
    value = last_number(answer) if answer is not None else None
    return float(value is not None and abs(value - target) <= tol)


def contains(answer: str | None, expected: str, *, normalize: bool = True) -> float:
    """1.0 if expected occurs in answer; with normalize, compared casefolded with whitespace collapsed."""
    if not expected or not expected.strip():
        raise ValueError("expected must be non-empty: every answer contains the empty string")
    if answer is None:
        return 0.0
    if normalize:
        return float(" ".join(expected.casefold().split()) in " ".join(answer.casefold().split()))
    return float(expected in answer)


def json_valid(answer: str | None) -> float:
    """1.0 if the whole answer (surrounding whitespace aside) is strict JSON (no NaN/Infinity)."""
    if answer is None:
        return 0.0
    try:
        loads_strict(answer)
    except ValueError:
        return 0.0
    return 1.0
