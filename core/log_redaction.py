"""API keys never reach a log line. aiohttp logs a request it cannot parse (bare-LF line endings, a bad header)
with the raw bytes of its head in the exception's message, `Authorization` header included; `RedactKeys`, a
filter on aiohttp's loggers (`redact_keys_in`), replaces the value of every key header in a record's message and
traceback with a marker before any handler sees it, and every bytes literal of a traceback (the raw excerpts a
parse error quotes: a folded header's second line or an over-long value shows a key without its header's name)."""
from __future__ import annotations

import logging
import re

MARKER = "[redacted]"
AIOHTTP_LOGGERS = ("aiohttp.server", "aiohttp.web", "aiohttp.access", "aiohttp.internal", "aiohttp.client")

# A header's value ends at the line's end: a real one, or the `\n` / `\r` escape of a bytes repr, or its quote.
_KEY_HEADER = re.compile(r"(?i)((?:proxy-)?authorization|x-api-key)(\s*:\s*)(?:[^\r\n\\'\"]|\\(?![rn]))*")


_BYTES_LITERAL = re.compile(r"b'(?:[^'\\\n]|\\.)*'" + r'|b"(?:[^"\\\n]|\\.)*"')


def redact_keys(text: str) -> str:
    return _KEY_HEADER.sub(lambda m: f"{m[1]}{m[2]}{MARKER}", text)


def redact_traceback(text: str) -> str:
    return _BYTES_LITERAL.sub(f"b'{MARKER}'", redact_keys(text))


class RedactKeys(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact_keys(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info:
            # The traceback is written here, redacted, and the exception dropped: no handler can write it whole.
            record.exc_text = redact_traceback(record.exc_text or logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        elif record.exc_text:
            record.exc_text = redact_traceback(record.exc_text)
        return True


def redact_keys_in(names: tuple[str, ...] = AIOHTTP_LOGGERS) -> None:
    """Add the filter to each named logger (once)."""
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactKeys) for f in logger.filters):
            logger.addFilter(RedactKeys())
