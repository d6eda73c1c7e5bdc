"""What every dialect shares: the engine's answer in neutral terms, and the interface a dialect implements."""
from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import orjson


@dataclass(slots=True)
class Output:
    """One chat choice the engine produced, in the terms every wire format needs."""

    text: str | None = None
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # chat form: {id, type, function{name, arguments}}
    finish_reason: str | None = None
    stop_reason: Any = None  # vLLM: the stop string that matched (str), a stop token id (int) or None
    logprobs: list[dict[str, Any]] | None = None  # chat `logprobs.content` entries, when the agent asked for them
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @classmethod
    def from_chat(cls, payload: dict[str, Any], prompt_tokens: int, completion_tokens: int) -> "Output":
        """From a chat completion (the engine's, or one assembled from its stream): choice 0."""
        choices = payload.get("choices") or [{}]
        choice = choices[0] if isinstance(choices[0], dict) else {}
        message = choice.get("message") or {}
        logprobs = choice.get("logprobs")
        return cls(
            text=message.get("content"),
            reasoning=message.get("reasoning") or message.get("reasoning_content"),
            tool_calls=[c for c in message.get("tool_calls") or () if isinstance(c, dict)],
            finish_reason=choice.get("finish_reason"),
            stop_reason=choice.get("stop_reason"),
            logprobs=logprobs.get("content") if isinstance(logprobs, dict) else None,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        )


class StreamTranslator(Protocol):
    """Turns the engine's chat chunks into the agent's stream events, as bytes ready to send."""

    def feed(self, chunk: dict[str, Any], prompt_tokens: int) -> bytes: ...

    def finish(self, output: Output) -> bytes: ...

    def error(self, status: int, message: str, kind: str, code: str | None) -> bytes: ...


class Dialect(Protocol):
    route: str  # the recorded call's route, and the metrics label
    path: str  # where agents send it, under /v1

    def validate(self, body: dict[str, Any]) -> None:
        """Raise `InvalidRequest` naming the parameter for a body the dialect cannot serve."""

    def to_chat(self, body: dict[str, Any], history: list[dict[str, Any]]) -> dict[str, Any]:
        """The chat request for the engine; `history` is earlier chat messages the proxy keeps (Responses)."""

    def build_response(self, body: dict[str, Any], output: Output, call_id: str, created: int) -> dict[str, Any]:
        """The agent's response body for a finished call."""

    def stream(self, body: dict[str, Any], call_id: str, created: int) -> StreamTranslator: ...

    def engine_error(self, status: int, raw: bytes) -> bytes:
        """The engine's error body (OpenAI-shaped) as this dialect's error body."""

    def chat_view(self, request: dict[str, Any] | None, response: dict[str, Any] | None
                  ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """A recorded request/response in chat form, for automatic rewards."""


def sse(event: str, payload: dict[str, Any]) -> bytes:
    """One named server-sent event, as both OpenAI's Responses and Anthropic's streams write them."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def sse_head(event: str) -> bytes:
    """The bytes of `sse(event, payload)` before the payload: the events sent once per engine chunk are
    written as `head + orjson.dumps(payload) + SSE_END`, their payload built in place (a call through `sse`
    with keyword fields merged into the payload costs more than serializing it)."""
    return b"event: " + event.encode() + b"\ndata: "


SSE_END = b"\n\n"


def imported_later(module: str, name: str) -> Callable[[], Any]:
    """`name` from `module`, imported on the first call and kept: for a module that imports the caller's (an
    import statement inside a function costs about a microsecond on every call)."""
    @functools.cache
    def load() -> Any:
        return getattr(importlib.import_module(module), name)

    return load


def text_of(content: Any) -> str:
    """The text of a content value: a string, or the text of a list of parts (any `text` field)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text") or "" if isinstance(part, dict) else str(part) for part in content)
    return str(content)


def engine_error_message(raw: bytes) -> tuple[str, str | None]:
    """The message and type of an engine's OpenAI-shaped error body (or its text when it is not one: an HTML
    page or a line of text from whatever answered in the engine's place, a framework's `{"detail": …}`)."""
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return " ".join(raw.decode("utf-8", errors="replace").split())[:2000] or "engine error", None
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict):
        return str(error.get("message") or "engine error"), error.get("type")
    if isinstance(error, str):
        return error, None
    for key in ("message", "detail"):  # vLLM's older top-level error, FastAPI's
        if isinstance(payload, dict) and payload.get(key):
            return str(payload[key])[:2000], payload.get("type") if key == "message" else None
    return str(payload)[:2000], None


OPENAI_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                      404: "not_found_error", 409: "conflict_error", 413: "invalid_request_error",
                      422: "invalid_request_error", 429: "rate_limit_error"}


def is_openai_error(raw: bytes) -> bool:
    """Whether an engine's error body is OpenAI-shaped already: `{"error": {"message": …, …}}`."""
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    error = payload.get("error") if isinstance(payload, dict) else None
    return isinstance(error, dict) and isinstance(error.get("message"), str)


def openai_engine_error(status: int, raw: bytes) -> bytes:
    """An engine's error body for an OpenAI route: as it is when OpenAI-shaped, else its text in that shape."""
    if is_openai_error(raw):
        return raw
    message, kind = engine_error_message(raw)
    kind = kind or OPENAI_ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}})
