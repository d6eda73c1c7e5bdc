"""What a rollout, agent or task id may be: one rule for the proxy, which receives ids, and for the runner, which
sends them (a task id the proxy would refuse fails its attempt in the runner, before any rollout is opened)."""
from __future__ import annotations

import re
import unicodedata

ID_LIMITS = {"rollout": 128, "agent": 128, "task": 256}  # characters
_ID = re.compile(r"[A-Za-z0-9._:@\-]+")  # safe in a URL path segment
# Task ids are free text (e.g. "gsm8k/train/17", "échecs/3"), shown in logs, the runner's lines and the web view, so
# they hold no character that changes how text around it shows: controls (C0 and C1: a terminal's escapes),
# format characters (U+202E turns what follows around, so one id displays as another; U+200B is invisible) and
# separators other than the space (line breaks, U+2028). aiohttp reads header bytes that are not UTF-8 as lone
# surrogates (surrogateescape), which no JSON writer or database takes: refused too.
_REFUSED_CATEGORIES = {"Cc": "a control character", "Cf": "a format character", "Cs": "a lone surrogate",
                       "Zl": "a line separator", "Zp": "a paragraph separator", "Zs": "a space other than ' '"}


def _refused_character(value: str) -> tuple[int, str, str] | None:
    """The first character a task id may not hold: its place, the character and what it is."""
    for place, character in enumerate(value):
        if character == " " or (character.isprintable() and not character.isspace()):
            continue  # the common case, cheaply: printable characters are none of the refused categories
        kind = _REFUSED_CATEGORIES.get(unicodedata.category(character))
        if kind is not None:
            return place, character, kind
    return None


def is_valid_id(value: str, what: str = "rollout") -> bool:
    """Whether `value` is a rollout, agent or task id the proxy accepts (ids reach URL paths and Postgres text)."""
    if what == "task":
        return task_id_problem(value) is None
    if value in (".", ".."):  # a path segment every URL library resolves away
        return False
    return len(value) <= ID_LIMITS[what] and _ID.fullmatch(value) is not None  # `$` would pass a final "\n"


def task_id_problem(value: str) -> str | None:
    """Why `value` cannot be a task id, in words (None when it can)."""
    if not value:
        return "the task id is empty"
    if len(value) > ID_LIMITS["task"]:
        return f"the task id is {len(value)} characters, more than a rollout's task id holds ({ID_LIMITS['task']})"
    refused = _refused_character(value)
    if refused is not None:
        place, character, kind = refused
        name = unicodedata.name(character, "") if kind != "a lone surrogate" else ""
        return f"the task id holds {kind} ({character!r}{', ' + name if name else ''}) at character {place}"
    return None
