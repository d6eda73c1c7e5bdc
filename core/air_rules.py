"""The rules of automatic intermediate rewards (AIR) as settings: each rule's weight and the patterns that mark a
tool result as an error. They sit on the ground floor so `rlproxy serve`'s settings can offer them as flags
without importing the functions that apply them (rewards/air.py)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from core.checks import require_finite

INVALID_ARGUMENTS = "invalid_arguments"
UNKNOWN_TOOL = "unknown_tool"
TOOL_ERROR = "tool_error"
TOOL_SUCCESS = "tool_success"

AIR_REASONS: tuple[str, ...] = (INVALID_ARGUMENTS, UNKNOWN_TOOL, TOOL_ERROR, TOOL_SUCCESS)

# Searched case-insensitively in tool results. `\b` word boundaries keep "error" from matching inside
# words such as "terrorism" or "error_code"; the look-behinds/look-aheads skip the negations that
# tools print on success ("no errors", "0 failed", "error-free", "errors: 0"). A missed error costs
# less than punishing a good call, so the patterns stay specific.
_NOT_NEGATED = r"(?<!\bno )(?<!\b0 )(?<!\bzero )(?<!\bwithout )"
DEFAULT_ERROR_PATTERNS: tuple[str, ...] = (
    _NOT_NEGATED + r"\b(?:errors?|exceptions?)\b(?!-free|\s*[:=]\s*(?:0|none|null)\b)",
    _NOT_NEGATED + r"\bfailed\b(?!\s*[:=]\s*0\b)",
    r"\btraceback\b",
    r"\bfatal\b",
    r"\bnon-zero exit\b",
    r"\bexit(?:ed with)?[ _](?:code|status)\s*[:=]?\s*[-+]?0*[1-9]\d*\b",  # exit code N, N != 0
    r"\bcommand not found\b",
    r"\bno such file or directory\b",
    r"\bpermission denied\b",
    r"(?-i:\b[A-Z][A-Za-z]*(?:Error|Exception)\b)",  # exception class names: ValueError, IOException
)

# Structured results (a JSON object) are judged by these keys, not by the words inside them, so
# `{"error": null, ...}` is not an error.

@dataclass(frozen=True)
class AirReward:
    value: float
    reason: str  # one of AIR_REASONS
    tool_call_id: str | None = None


@dataclass(frozen=True)
class AirRules:
    """Weights of the AIR rules (0 turns a rule off) and the patterns that mark a tool result as an error."""

    enabled: bool = True
    invalid_arguments: float = -0.5
    unknown_tool: float = -0.5
    tool_error: float = -0.25
    tool_success: float = 0.0
    error_patterns: tuple[str, ...] = DEFAULT_ERROR_PATTERNS
    # Text tool protocols (rewards/text_tools.py), regular expressions (case-sensitive; `(?i)` ignores case):
    # an action pattern found in a reply marks it as a tool call; the turn that answers it is a tool_error
    # when an error pattern matches at its start, a tool_success when a success pattern does. No action
    # pattern: off.
    text_action_patterns: tuple[str, ...] = ()
    text_error_patterns: tuple[str, ...] = ()
    text_success_patterns: tuple[str, ...] = ()
    _compiled: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)
    _text_compiled: dict[str, tuple[re.Pattern[str], ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for reason in AIR_REASONS:
            require_finite(getattr(self, reason), f"AIR weight {reason}")
        object.__setattr__(self, "_compiled", self._compile("error_patterns", re.IGNORECASE, "error"))
        text = {kind: self._compile(f"text_{kind}_patterns", re.MULTILINE, f"text {kind}")
                for kind in ("action", "error", "success")}
        if text["action"] and not (text["error"] or text["success"]):
            raise ValueError("AIR text_action_patterns need text_error_patterns or text_success_patterns")
        if not text["action"] and (text["error"] or text["success"]):
            raise ValueError("AIR text error/success patterns need text_action_patterns (what a tool call is)")
        object.__setattr__(self, "_text_compiled", text)

    def _compile(self, name: str, flags: int, what: str) -> tuple[re.Pattern[str], ...]:
        patterns = getattr(self, name)
        if isinstance(patterns, str):
            raise ValueError(f"{name} must be a sequence of regular expressions, not one string")
        patterns = tuple(patterns)
        compiled = []
        for pattern in patterns:
            try:
                compiled.append(re.compile(pattern, flags))
            except (re.error, TypeError) as exc:
                raise ValueError(f"invalid AIR {what} pattern {pattern!r}: {exc}") from None
        object.__setattr__(self, name, patterns)
        return tuple(compiled)

    def weight(self, reason: str) -> float:
        if reason not in AIR_REASONS:
            raise ValueError(f"unknown AIR reason {reason!r}; expected one of {AIR_REASONS}")
        return float(getattr(self, reason))

    def reward(self, reason: str, tool_call_id: str | None = None) -> list[AirReward]:
        """The rule's reward as a 0- or 1-element list (0 when the rule is off)."""
        value = self.weight(reason)
        return [AirReward(value, reason, tool_call_id)] if value != 0.0 else []
