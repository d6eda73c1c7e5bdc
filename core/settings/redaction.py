"""Whether recorded text is kept: one setting that every process reads alike (the proxies redact what they store,
the trainer refuses what needs the text), so one `RLPROXY_REDACT_CONTENT` says it to all of them."""
from __future__ import annotations

from pydantic import Field

from core.settings.base import Part


class Redaction(Part):
    redact_content: bool = Field(
        False, description="The proxies store message and completion text as a marker (token ids are kept); one "
                           "RLPROXY_REDACT_CONTENT for every process says it once. The trainer then refuses to "
                           "start with a judge (reward judge or judge+posted), which could only read the marker.")
