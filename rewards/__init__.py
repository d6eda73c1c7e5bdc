"""Rewards: from an episode's outcome to per-call training signal. Pure functions, no I/O.

The pipeline, one module per step:

    credit      episode return R -> one return per call (LightningRL: identical, or discounted),
                plus each call's own intermediate rewards
    advantages  per-rollout returns -> advantages, baselined within a task group (grpo, rloo,
                reinforce_baseline, reinforce) or against the batch when there is no group
    air         Automatic Intermediate Rewards read off chat traffic: malformed or unknown tool
                calls, and tool results that report errors
    text_tools  the same tool outcomes for agents with a text tool protocol (markers in the turns)
    scorers     ready-made outcome checks (exact, numeric, contains, JSON) for an agent's final reward
"""
from rewards.advantages import (
    ESTIMATORS,
    GRPO,
    NEEDS_GROUP,
    REINFORCE,
    REINFORCE_BASELINE,
    RLOO,
    batch_baseline,
    estimate,
    group_advantages,
    grpo,
    normalize,
    reinforce,
    reinforce_baseline,
    rloo,
)
from rewards.air import (
    AIR_REASONS,
    DEFAULT_ERROR_PATTERNS,
    INVALID_ARGUMENTS,
    TOOL_ERROR,
    TOOL_SUCCESS,
    UNKNOWN_TOOL,
    AirReward,
    AirRules,
    find_tool_results,
    is_tool_error,
    merge_by_reason,
    score_text_tool_result,
    score_tool_calls,
)
from rewards.credit import CREDIT_MODES, CreditMode, assign_credit
from rewards.scorers import contains, exact_match, json_valid, last_number, numeric_match
from rewards.text_tools import score_text_tools, text_tool_outcome

__all__ = [
    "AIR_REASONS",
    "CREDIT_MODES",
    "DEFAULT_ERROR_PATTERNS",
    "ESTIMATORS",
    "GRPO",
    "INVALID_ARGUMENTS",
    "NEEDS_GROUP",
    "REINFORCE",
    "REINFORCE_BASELINE",
    "RLOO",
    "TOOL_ERROR",
    "TOOL_SUCCESS",
    "UNKNOWN_TOOL",
    "AirReward",
    "AirRules",
    "CreditMode",
    "assign_credit",
    "batch_baseline",
    "contains",
    "estimate",
    "exact_match",
    "find_tool_results",
    "group_advantages",
    "grpo",
    "is_tool_error",
    "json_valid",
    "last_number",
    "merge_by_reason",
    "normalize",
    "numeric_match",
    "reinforce",
    "reinforce_baseline",
    "rloo",
    "score_text_tool_result",
    "score_text_tools",
    "score_tool_calls",
    "text_tool_outcome",
]
