"""Credit assignment: spread an episode's return over the policy calls that produced it.

LightningRL treats each call of an episode as one transition and, by default, gives every call the
episode's final return. `discounted` instead favours the calls closest to the outcome. On top of that,
each call keeps its own intermediate rewards (posted by the agent or derived by AIR).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum

from core.checks import require_finite


class CreditMode(StrEnum):
    IDENTICAL = "identical"  # every call gets R
    DISCOUNTED = "discounted"  # call t gets gamma^(T-1-t) * R


CREDIT_MODES: tuple[str, ...] = tuple(mode.value for mode in CreditMode)

IntermediateRewards = Sequence[Sequence[float]] | Mapping[int, Sequence[float]]


def assign_credit(
    final_return: float,
    num_calls: int,
    *,
    mode: CreditMode | str = CreditMode.IDENTICAL,
    gamma: float = 1.0,
    intermediate: IntermediateRewards | None = None,
    intermediate_weight: float = 1.0,
) -> list[float]:
    """Per-call returns for an episode of `num_calls` calls ordered by seq.

        identical:   G_t = R + w * sum(r_t)
        discounted:  G_t = gamma^(T-1-t) * R + w * sum(r_t)

    where T = num_calls, r_t are call t's intermediate rewards and w = intermediate_weight.
    `intermediate` is either a list with one list of rewards per call, or a mapping
    call index -> rewards (calls that are absent have none).
    """
    mode = _parse_mode(mode)
    final_return = require_finite(final_return, "final_return")
    intermediate_weight = require_finite(intermediate_weight, "intermediate_weight")
    gamma = require_finite(gamma, "gamma")
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"gamma must be in (0, 1], got {gamma}")
    if isinstance(num_calls, bool) or not isinstance(num_calls, int) or num_calls < 0:
        raise ValueError(f"num_calls must be a non-negative int, got {num_calls!r}")

    own = _sum_intermediate(intermediate, num_calls)
    last = num_calls - 1
    returns = []
    for t in range(num_calls):
        share = final_return if mode is CreditMode.IDENTICAL else gamma ** (last - t) * final_return
        returns.append(share + intermediate_weight * own[t])
    return returns


def _parse_mode(mode: CreditMode | str) -> CreditMode:
    try:
        return CreditMode(mode)
    except ValueError:
        raise ValueError(f"unknown credit mode {mode!r}; expected one of {CREDIT_MODES}") from None


def _sum_intermediate(intermediate: IntermediateRewards | None, num_calls: int) -> list[float]:
    """Sum of each call's own intermediate rewards, validated against the episode length."""
    sums = [0.0] * num_calls
    if intermediate is None:
        return sums
    if isinstance(intermediate, Mapping):
        items = list(intermediate.items())
    elif isinstance(intermediate, Sequence) and not isinstance(intermediate, str):
        if len(intermediate) != num_calls:
            raise ValueError(
                f"intermediate rewards list has {len(intermediate)} entries for {num_calls} calls; "
                "pass one list per call, or a mapping call index -> rewards"
            )
        items = list(enumerate(intermediate))
    else:
        kind = type(intermediate).__name__
        raise ValueError(f"intermediate rewards must be a list or a mapping, got {kind}")

    for index, rewards in items:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < num_calls:
            raise ValueError(f"intermediate reward call index {index!r} is outside 0..{num_calls - 1}")
        if isinstance(rewards, str) or not isinstance(rewards, Sequence):
            raise ValueError(f"intermediate rewards of call {index} must be a list of numbers: {rewards!r}")
        sums[index] += sum(require_finite(r, f"intermediate reward of call {index}") for r in rewards)
    return sums
