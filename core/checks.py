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


# The largest reward magnitude taken, by every door a reward comes in through (POST /reward, reward events, OTLP
# spans, the store's own writer). Group statistics square rewards: 1e300 is finite but overflows there, and one
# such reward in a batch would stop the trainer for every project. No reward scale in use comes near 1e6.
REWARD_LIMIT = 1e6


def reward_problem(value: object) -> str | None:
    """Why `value` cannot be a reward (a message for the client), or None when it can."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return f"a reward must be a number, not {type(value).__name__}"
    if not math.isfinite(value):
        return "a reward must be a finite number"
    if abs(value) > REWARD_LIMIT:
        return f"a reward must be between -{REWARD_LIMIT:g} and {REWARD_LIMIT:g}"
    return None


def nests_deeper_than(value: Any, limit: int) -> bool:
    """Whether parsed JSON `value` nests lists and dicts more than `limit` levels (a container is level 1), walked
    one level at a time: no recursion to run out of."""
    level, depth = [value], 0
    while level:
        depth += 1
        if depth > limit:
            return True
        level = [child for item in level if isinstance(item, (dict, list))
                 for child in (item.values() if isinstance(item, dict) else item) if isinstance(child, (dict, list))]
    return False


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def loads_strict(text: str) -> Any:
    """`json.loads` that also rejects NaN/Infinity, which Python accepts but JSON does not.

    Raises ValueError (json.JSONDecodeError is one) for anything that is not JSON.
    """
    return json.loads(text, parse_constant=_reject_constant)
