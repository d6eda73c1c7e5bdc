"""What every dialect shares: the engine's answer in neutral terms, the interface a dialect implements, and the
bytes of server-sent events and error bodies."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol

import orjson

from proxy.capture import Additions
from proxy.errors import UpstreamUnavailable
from proxy.dialects.sse import Event


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


class Translator(Protocol):
    """One call's answer in the agent's wire format, made from the engine's (chat, or completions): whole, or
    event by event as the engine streams it. Made per call by `Dialect.translator`."""

    final: dict[str, Any] | None  # the answer the agent received, whole, once made (None: the engine's own
    # answer is recorded, as the stream assembled it)

    def whole(self, payload: dict[str, Any] | None, raw: bytes, tokens: tuple[int, int]) -> bytes:
        """The agent's body for the engine's answer `raw`, parsed as `payload` (None when it is not JSON: a
        translating dialect raises `UpstreamUnavailable`, a passthrough relays it); `tokens` are the prompt's and
        the completion's exact counts (`Output.from_chat` makes the answer in neutral terms with them)."""

    def feed(self, chunk: dict[str, Any] | None, event: Event, prompt_tokens: int) -> bytes:
        """The agent's bytes for one event of the engine's stream: `chunk` is its JSON object, None for an event
        that holds none (a comment, text)."""

    def finish(self, payload: dict[str, Any], tokens: tuple[int, int], done: Event | None) -> bytes:
        """The stream's last bytes: `payload` is the engine's answer as its stream assembled it, `tokens` as for
        `whole`; `done` is the engine's `[DONE]` event, None when the engine closed the stream without one."""

    def error(self, status: int, message: str, kind: str, code: str | None, event: Event | None = None) -> bytes:
        """The stream's last bytes when the call fails: the engine's error `event` (a chunk holding only an
        error), or the proxy's own error (a timeout, a lost connection, a record that could not be kept)."""


class Dialect(Protocol):
    """A wire format agents speak, over the one capture core (proxy/serving.py)."""

    route: str  # the recorded call's route, and the metrics label
    translates: bool  # answers in a format of its own (Responses, Messages), not relaying the engine's
    path: str  # where agents send it, under /v1
    engine_route: str  # how the engine is asked and its answer read: chat or completions (proxy/capture.py)
    engine_path: str  # where the engine is asked

    def validate(self, body: dict[str, Any], allowed: frozenset[str] = frozenset()) -> None:
        """Raise `InvalidRequest` naming the parameter for a body the dialect cannot serve: one with a field
        the route does not take (`allowed`: the fields the operator allows besides), or one it cannot read."""

    def to_chat(self, body: dict[str, Any], history: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """The request for the engine's route; `history` is earlier chat messages the proxy keeps (Responses)."""

    def translator(self, body: dict[str, Any], call_id: str, created: int, additions: Additions) -> Translator:
        """What makes this call's answer; `additions` says what the proxy asked the engine for on its own."""

    def engine_error(self, status: int, raw: bytes) -> bytes:
        """The engine's error body (OpenAI-shaped) as this dialect's error body."""


DONE = Event("[DONE]", b"data: [DONE]\n\n")


def replay(translator: Translator, payload: dict[str, Any], tokens: tuple[int, int]) -> bytes:
    """The whole event stream of an engine's answer that came as one chat completion (`payload`) when the agent
    asked for a stream (an engine that ignores `stream`): the answer is fed to the translator as the one chunk
    a stream of it would add up to, then finished as on the engine's `[DONE]`. The OpenAI and Anthropic SDKs
    read a `stream: true` answer as events whatever its content type, so a JSON body gave them no event at all;
    this way they get the stream the API promises, with what the whole answer holds."""
    return translator.feed(as_chunk(payload), DONE, tokens[0]) + translator.finish(payload, tokens, DONE)


def as_chunk(payload: dict[str, Any]) -> dict[str, Any]:
    """A chat completion as the single stream chunk carrying all of it: each choice's message as its delta, its
    tool calls numbered as a stream numbers them."""
    choices = []
    for position, choice in enumerate(payload.get("choices") or ()):
        if not isinstance(choice, dict):
            continue
        message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
        delta = {key: message[key] for key in ("role", "content", "reasoning", "reasoning_content")
                 if message.get(key) is not None}
        calls = [{**call, "index": index} for index, call in enumerate(message.get("tool_calls") or ())
                 if isinstance(call, dict)]
        if calls:
            delta["tool_calls"] = calls
        choices.append({"index": choice.get("index", position), "delta": delta, "logprobs": choice.get("logprobs"),
                        "finish_reason": choice.get("finish_reason"), "stop_reason": choice.get("stop_reason")})
    return {**{key: payload.get(key) for key in ("id", "created", "model")}, "choices": choices}


ENDED_EARLY = (502, "the engine ended the stream early", "upstream_error", None)  # a translator's `error` args


def unparsed(event: Event) -> bytes:
    """What a translating dialect sends for an engine event without a chunk: text that is not a JSON object is
    relayed as it came, as on the chat route; an event without data (a comment, a keep-alive) is left out."""
    return b"" if event.data is None else event.raw


def unreadable() -> NoReturn:
    """A translating dialect cannot answer from an engine answer that is not JSON."""
    raise UpstreamUnavailable("engine returned invalid JSON")


def sse(event: str, payload: dict[str, Any]) -> bytes:
    """One named server-sent event, as both OpenAI's Responses and Anthropic's streams write them."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def sse_head(event: str) -> bytes:
    """The bytes of `sse(event, payload)` before the payload: the events sent once per engine chunk are
    written as `head + orjson.dumps(payload) + SSE_END`, their payload built in place (a call through `sse`
    with keyword fields merged into the payload costs more than serializing it)."""
    return b"event: " + event.encode() + b"\ndata: "


SSE_END = b"\n\n"


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
