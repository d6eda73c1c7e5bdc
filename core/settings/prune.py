"""Pruning: what recorded data goes past what age. One group of settings, `rlproxy prune`'s (`--older-than`) and
the trainer's (`--prune-older-than`, between steps): the same fields, parsed the same way, documented once."""
from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from core.settings.base import CommandSettings, Part
from core.settings.locations import DEFAULT_DATABASE_URL

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def seconds(value: str | float) -> float:
    """'30d', '12h', '90m', '45s', '2w' or a number of seconds, in seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhdw]?)", str(value).strip().lower())
    if not match:
        raise ValueError(f"{value!r}: expected a duration like 30d, 12h, 90m or a number of seconds")
    return float(match.group(1)) * UNITS[match.group(2) or "s"]


Age = Annotated[float, BeforeValidator(seconds)]


class Pruning(Part):
    older_than: Age = Field(
        ge=0, description="Age past which data goes, by the rollout's creation: 30d, 12h, 90m, or seconds (the "
                          "trainer's --prune-older-than: 0, its default, is off).",
        json_schema_extra={"text": True, "metavar": "AGE"})
    what: Literal["calls", "bodies"] = Field(
        "calls", description="calls: delete whole rollouts (with their calls and rewards) and calls outside "
                             "rollouts; bodies: keep every row, clear only request and response bodies (token ids, "
                             "logprobs, rewards stay).")
    keep_trained_ids: bool = Field(
        False, description="With what=calls: trained rollouts keep their rows (ids, logprobs, rewards) and lose "
                           "only their bodies, so `rlproxy export` still rebuilds what was trained on.")


# The trainer's pruning (off until an age is given); its flags are `--prune-older-than` and so on.
PRUNING_OFF = Pruning(older_than=0.0)


class PruneSettings(CommandSettings):
    database_url: str = Field(DEFAULT_DATABASE_URL, description="SQLAlchemy async database URL.")
    pruning: Pruning = Field(description="What goes, past what age.")  # --older-than is required
    batch: int = Field(500, ge=1, description="Rollouts (and loose calls) per transaction.")
