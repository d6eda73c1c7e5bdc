"""Small validators shared by the settings models and the reward functions."""
from __future__ import annotations

import json
import math
import numbers
from typing import Any


def require_finite(value: float, what: str) -> float:
    """Return `value` as a float, or raise ValueError naming `what` if it is not a finite number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{what} must be a number, got {type(value).__name__}: {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{what} must be finite, got {value!r}")
    return float(value)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def loads_strict(text: str) -> Any:
    """`json.loads` that also rejects NaN/Infinity, which Python accepts but JSON does not.

    Raises ValueError (json.JSONDecodeError is one) for anything that is not JSON.
    """
    return json.loads(text, parse_constant=_reject_constant)
