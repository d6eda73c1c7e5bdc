"""AIR for agents with a text tool protocol: tool outcomes read from the turns the agent sends back.

An agent without native tool calls writes its tool call into its reply (the demo agent: `CALC: 37 * 46`)
and reports the tool's outcome in the next user turn (`RESULT: 1702` or `ERROR: division by zero`). With
the `text_*_patterns` of `AirRules` set, such an exchange is scored like a native tool call:

    reply (the earlier call's recorded response, choice 0)   an action pattern is found in its text
    the later call's messages                                 continue the earlier call's: its messages,
                                                              the reply (its last assistant turn), then a
                                                              user or tool turn
    that turn                                                 an error pattern matches at its start:
                                                              tool_error; a success pattern: tool_success

Patterns are regular expressions (`re.MULTILINE`, case-sensitive unless they say `(?i)`): action
patterns are searched anywhere in the reply, error and success patterns must match at the start of the
turn (leading whitespace ignored), so a plain prefix such as `ERROR:` is a pattern. The weights are the
native rules' (tool_error -0.25; tool_success 0, i.e. off). The reply must stand in the later call's
messages right after the earlier call's messages, with the same text (outer whitespace ignored): an
agent that rewrote or dropped history, or a retry that answers an older reply, gets nothing, as does a
reply with native tool calls (the native rules judge those). Pure functions, no I/O.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from core.text import content_text
from rewards.air import TOOL_ERROR, TOOL_SUCCESS, AirReward, AirRules, _first_message, _requested_calls


def text_tool_outcome(reply_text: str | None, later_messages: Sequence[Mapping[str, Any]] | None,
                      rules: AirRules, reply_at: int | None = None) -> str | None:
    """TOOL_ERROR or TOOL_SUCCESS when `later_messages` answer the tool action in `reply_text`, else None.

    The reply is looked for as the last assistant turn of `later_messages`; with `reply_at` (the number of
    messages of the call that wrote the reply) that turn must also stand at that index.
    """
    if not rules.enabled or not rules.text_action_patterns or not reply_text:
        return None
    patterns = rules._text_compiled
    if not any(pattern.search(reply_text) for pattern in patterns["action"]):
        return None
    messages = list(later_messages or ())
    last = max((i for i, m in enumerate(messages) if isinstance(m, Mapping) and m.get("role") == "assistant"),
               default=None)
    if last is None or last + 1 >= len(messages) or (reply_at is not None and last != reply_at):
        return None
    if content_text(messages[last].get("content")).strip() != reply_text.strip():
        return None
    answer = messages[last + 1]
    if not isinstance(answer, Mapping) or answer.get("role") not in ("user", "tool"):
        return None
    text = content_text(answer.get("content")).lstrip()
    if any(pattern.match(text) for pattern in patterns["error"]):
        return TOOL_ERROR
    if any(pattern.match(text) for pattern in patterns["success"]):
        return TOOL_SUCCESS
    return None


def score_text_tools(prev_request: Mapping[str, Any] | None, prev_response: Mapping[str, Any] | None,
                     later_messages: Sequence[Mapping[str, Any]] | None,
                     rules: AirRules | None = None) -> list[AirReward]:
    """The text-protocol AIR reward (0 or 1 of them) for the call with this chat request and response."""
    rules = rules or AirRules()
    message = _first_message(prev_response)
    earlier = prev_request.get("messages") if isinstance(prev_request, Mapping) else None
    if message is None or _requested_calls(message) or not isinstance(earlier, list):
        return []
    reason = text_tool_outcome(content_text(message.get("content")), later_messages, rules, len(earlier))
    return rules.reward(reason) if reason else []
