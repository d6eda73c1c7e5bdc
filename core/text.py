"""The completion text of a recorded response, whatever API it came through (for export and reports)."""
from __future__ import annotations

from typing import Any


def completion_text(route: str | None, response: dict[str, Any] | None) -> str | None:
    """Choice 0's text (chat, completions), the output messages' text (Responses) or the text blocks (Messages)."""
    if not isinstance(response, dict):
        return None
    if route == "responses":
        return "".join(part.get("text") or "" for item in response.get("output") or ()
                       if isinstance(item, dict) and item.get("type") == "message"
                       for part in item.get("content") or () if isinstance(part, dict))
    if route == "messages":
        return "".join(block.get("text") or "" for block in response.get("content") or ()
                       if isinstance(block, dict) and block.get("type") == "text")
    choice = (response.get("choices") or [{}])[0]
    if not isinstance(choice, dict):
        return None
    return (choice.get("message") or {}).get("content") if "message" in choice else choice.get("text")
