"""How the stand-in engine (testkit/stub_engine.py) fails a stream on request: `stream_fault` reads the controls
`stub_end_after` and `stub_error_after` from the request body and says what to do before each chunk."""
from __future__ import annotations

import json

from core.errors import RlproxyError


class EndStream(RlproxyError):
    """The stream ends here; `done`: `data: [DONE]` follows what was sent (as vLLM ends a stream that failed)."""

    def __init__(self, done: bool = False) -> None:
        super().__init__()
        self.done = done


# vLLM's error event when generation fails mid-stream, before its [DONE]
ERROR_EVENT = b"data: " + json.dumps({"error": {"message": "stub engine failed mid-stream",
                                                "type": "InternalServerError", "param": None, "code": 500}},
                                     separators=(",", ":")).encode() + b"\n\n"


def stream_fault(body: dict, sent: int) -> bytes | None:
    """Before chunk number `sent` (from 0): None to send it, else raise `EndStream` or return the bytes of the
    error event to send before raising it (the caller writes them, then raises `EndStream(done=True)`)."""
    if body.get("stub_end_after") is not None and sent >= body["stub_end_after"]:
        raise EndStream
    if body.get("stub_error_after") is not None and sent >= body["stub_error_after"]:
        return ERROR_EVENT
    return None
