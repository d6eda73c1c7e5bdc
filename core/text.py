"""Text read out of the three wire formats: a message's content as text, and a recorded response's completion text.

Every reader of content (AIR's tool results, the judge's trajectories, the Messages dialect's tool results, export)
uses `content_text`, so one content shape never reads two ways. Imports nothing of the project.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def content_text(content: Any, separator: str = "\n") -> str:
    """A message's content as text, in any of the three wire formats: a string as it is; a list of parts as the
    texts of its parts joined by `separator` (a part is a string, or an object with a string `text`: chat `text`,
    Responses `input_text`/`output_text`, Messages `text` blocks); parts without text (images, files) add
    nothing; None is ""; any other value is written as JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                texts.append(part["text"])
        return separator.join(texts)
    return json.dumps(content)


def completion_text(route: str | None, response: dict[str, Any] | None) -> str | None:
    """Choice 0's text (chat, completions), the output messages' text (Responses), the text blocks (Messages) or
    candidate 0's text parts (Gemini)."""
    if not isinstance(response, dict):
        return None
    if route == "responses":
        return "".join(part.get("text") or "" for item in response.get("output") or ()
                       if isinstance(item, dict) and item.get("type") == "message"
                       for part in item.get("content") or () if isinstance(part, dict))
    if route == "messages":
        return "".join(block.get("text") or "" for block in response.get("content") or ()
                       if isinstance(block, dict) and block.get("type") == "text")
    if route == "gemini":
        candidate = (response.get("candidates") or [{}])[0]
        content = candidate.get("content") if isinstance(candidate, dict) else None
        return "".join(part.get("text") or "" for part in (content or {}).get("parts") or ()
                       if isinstance(part, dict) and not part.get("thought"))
    choice = (response.get("choices") or [{}])[0]
    if not isinstance(choice, dict):
        return None
    return (choice.get("message") or {}).get("content") if "message" in choice else choice.get("text")


def printable(text: str, limit: int | None = None) -> str:
    """`text` safe to write into a log line or onto a terminal: every character that is not printable (C0 and C1
    controls: newlines that forge log lines, ESC that drives a terminal; format characters such as U+202E that
    turn what follows around; line separators; lone surrogates) written as its escape (`\\x1b`, `\\u202e`), and
    cut at `limit` characters with an ellipsis. What a request sent (its path, ids, a model name) passes through
    here before any log line quotes it."""
    if not text.isprintable():
        text = "".join(character if character.isprintable() or character == " " else _escape(character)
                       for character in text)
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def _escape(character: str) -> str:
    code = ord(character)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
