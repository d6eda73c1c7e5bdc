"""The engine's answer as the Gemini API's: the GenerateContentResponse whole, or its stream
(`streamGenerateContent?alt=sse`: each event one `data:` line holding a GenerateContentResponse).

Text (and, when the agent asked for thoughts, reasoning as `thought` parts) goes out as the engine writes it, one
event per engine chunk that carries any. The last event holds each candidate's function calls, its finishReason
and the call's usageMetadata: Gemini sends a function call whole in one part, and partial arguments streamed as
the model wrote them could not be taken back once they prove malformed (the whole answer keeps those under `_raw`).
An error becomes one event holding Google's error body, which ends the stream.
"""
from __future__ import annotations

from typing import Any

import orjson

from proxy.dialects.base import ENDED_EARLY, unparsed, unreadable
from proxy.dialects.gemini_objects import build, error_body, finish_reason, function_call, usage, wants_thoughts
from proxy.dialects.sse import Event

DATA, END = b"data: ", b"\r\n\r\n"  # as Google's servers write their events


class GeminiStream:
    """One call's answer (proxy/dialects/base.py `Translator`)."""

    def __init__(self, body: dict[str, Any], call_id: str) -> None:
        self.body = body
        self.call_id = call_id
        self.thoughts = wants_thoughts(body)
        self.final: dict[str, Any] | None = None
        self.failed = False  # an error event was sent: it ends the stream

    def _event(self, candidates: list[dict[str, Any]], **more: Any) -> bytes:
        payload = {"candidates": candidates, **more, "modelVersion": self.body["model"], "responseId": self.call_id}
        return DATA + orjson.dumps(payload) + END

    def whole(self, payload: dict[str, Any] | None, raw: bytes, tokens: tuple[int, int]) -> bytes:
        if payload is None:
            unreadable()
        self.final = build(self.body, payload, tokens, self.call_id)
        return orjson.dumps(self.final)

    def feed(self, chunk: dict[str, Any] | None, event: Event, prompt_tokens: int) -> bytes:
        if chunk is None:
            return unparsed(event)
        candidates = []
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            parts = []
            reasoning = delta.get("reasoning") or delta.get("reasoning_content")
            if reasoning and self.thoughts:
                parts.append({"text": reasoning, "thought": True})
            if delta.get("content"):
                parts.append({"text": delta["content"]})
            if parts:
                candidates.append({"content": {"role": "model", "parts": parts}, "index": choice.get("index", 0)})
        return self._event(candidates) if candidates else b""

    def finish(self, payload: dict[str, Any], tokens: tuple[int, int], done: Event | None) -> bytes:
        if done is None:
            return self.error(*ENDED_EARLY)
        if self.failed:  # the engine's [DONE] after an error: the error event was the stream's end
            return b""
        candidates = []
        for position, choice in enumerate(payload.get("choices") or ()):
            if not isinstance(choice, dict):
                continue
            message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
            calls = [function_call(call) for call in message.get("tool_calls") or () if isinstance(call, dict)]
            candidate: dict[str, Any] = {"finishReason": finish_reason(choice.get("finish_reason")),
                                         "index": choice.get("index", position)}
            if calls:
                candidate = {"content": {"role": "model", "parts": calls}, **candidate}
            candidates.append(candidate)
        self.final = build(self.body, payload, tokens, self.call_id)
        return self._event(candidates, usageMetadata=usage(*tokens))

    def error(self, status: int, message: str, kind: str, code: str | None, event: Event | None = None) -> bytes:
        if self.failed:
            return b""
        self.failed = True
        return DATA + orjson.dumps(error_body(status, message)) + END
