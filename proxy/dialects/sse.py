"""Incremental Server-Sent Events parsing: bytes in as they arrive, whole events out."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class Event:
    data: str | None  # the joined `data:` lines, None for an event without data (comments, keep-alives)
    raw: bytes  # the event's bytes exactly as received, terminator included

    @property
    def is_done(self) -> bool:
        return self.data == "[DONE]"


class SSEParser:
    """Splits a byte stream into events at blank lines (`\\n\\n`, `\\r\\n\\r\\n` or `\\r\\r`)."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._held_cr = False  # a chunk ended in CR: it may be the first half of a CRLF

    def feed(self, chunk: bytes) -> list[Event]:
        if self._held_cr:
            chunk = b"\r" + chunk
            self._held_cr = False
        if chunk.endswith(b"\r"):
            chunk, self._held_cr = chunk[:-1], True
        self._buffer += chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n") if b"\r" in chunk else chunk
        events = []
        while True:
            end = self._buffer.find(b"\n\n")
            if end < 0:
                return events
            raw = bytes(self._buffer[: end + 2])
            del self._buffer[: end + 2]
            events.append(_parse(raw))

    def flush(self) -> list[Event]:
        """Whatever remains when the stream ends without a final blank line."""
        if self._held_cr:
            self._buffer += b"\n"
            self._held_cr = False
        if not self._buffer.strip():
            self._buffer.clear()
            return []
        raw = bytes(self._buffer) + b"\n\n"
        self._buffer.clear()
        return [_parse(raw)]


def _parse(raw: bytes) -> Event:
    data_lines = []
    for line in raw.decode("utf-8", errors="replace").split("\n"):
        if line.startswith("data:"):
            value = line[5:]
            data_lines.append(value[1:] if value.startswith(" ") else value)
    return Event("\n".join(data_lines) if data_lines else None, raw)
