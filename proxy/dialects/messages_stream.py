"""The engine's answer as Anthropic's Messages API's: the Message whole, or the event stream.

`message_start` (with the prompt's token count), `ping`, then per content block `content_block_start`,
its deltas (`text_delta`, `input_json_delta`, `thinking_delta`) and `content_block_stop`; last `message_delta`
(stop reason and output tokens) and `message_stop`. An error becomes an `error` event. A tool_use block's input
goes as one `input_json_delta` when the block ends, as the whole Message's `input` is (text that is not a JSON
object under `_raw`): partial JSON streamed as the model wrote it cannot be taken back once it proves malformed.
"""
from __future__ import annotations

from typing import Any

import orjson

from core.messages_chat import RAW_INPUT
from proxy.dialects.base import ENDED_EARLY, SSE_END, Output, sse, sse_head, unparsed, unreadable
from proxy.dialects.messages_objects import build, error_body, message_id, stop_of, tool_input
from proxy.dialects.sse import Event

# The events sent once per engine chunk, and the constant ones, as bytes (`sse_head`).
DELTA = sse_head("content_block_delta")
PING = sse("ping", {"type": "ping"})
STOP = sse("message_stop", {"type": "message_stop"})
TEXT, THINKING = ("text", None), ("thinking", None)  # the open block, as `MessagesStream.open` names it


class MessagesStream:
    """One call's answer (proxy/dialects/base.py `Translator`)."""

    def __init__(self, body: dict[str, Any], call_id: str) -> None:
        self.body = body
        self.call_id = call_id
        self.started = False
        self.blocks = 0  # content blocks opened so far
        self.open: tuple[str, Any] | None = None  # (kind, tool index) of the block being written
        self.final: dict[str, Any] | None = None  # the whole Message, once finished
        self.failed = False  # an `error` event was sent: it ends the stream
        # The open tool_use block's arguments, sent as one input_json_delta when it closes: a model's malformed
        # JSON, streamed as it came, made Anthropic's SDK raise while the whole Message carries it under `_raw`.
        self.arguments: list[str] = []

    def _start(self, prompt_tokens: int) -> bytes:
        self.started = True
        message = {"id": message_id(self.call_id), "type": "message", "role": "assistant",
                   "model": self.body["model"], "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": prompt_tokens, "output_tokens": 0}}
        return sse("message_start", {"type": "message_start", "message": message}) + PING

    def _block(self, opened: tuple[str, Any], block: dict[str, Any]) -> bytes:
        """Close the open block (the caller knows it is another one) and open this one."""
        out = self._stop_block()
        self.open = opened
        out += sse("content_block_start", {"type": "content_block_start", "index": self.blocks,
                                           "content_block": block})
        return out

    def _stop_block(self) -> bytes:
        if self.open is None:
            return b""
        out = b""
        if self.open[0] == "tool_use" and self.arguments:
            text = "".join(self.arguments)
            written = tool_input(text)  # what the whole Message's `input` is
            out = self._delta({"type": "input_json_delta",
                               "partial_json": text if RAW_INPUT not in written else orjson.dumps(written).decode()})
        self.arguments = []
        self.open = None
        self.blocks += 1
        return out + sse("content_block_stop", {"type": "content_block_stop", "index": self.blocks - 1})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return DELTA + orjson.dumps({"type": "content_block_delta", "index": self.blocks, "delta": delta}) + SSE_END

    def whole(self, payload: dict[str, Any] | None, raw: bytes, tokens: tuple[int, int]) -> bytes:
        if payload is None:
            unreadable()
        output = Output.from_chat(payload, *tokens)
        self.final = build(self.body, output, self.call_id)
        return orjson.dumps(self.final)

    def feed(self, chunk: dict[str, Any] | None, event: Event, prompt_tokens: int) -> bytes:
        if chunk is None:
            return unparsed(event)
        out = b"" if self.started else self._start(prompt_tokens)
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning") or delta.get("reasoning_content")
            if reasoning:
                if self.open != THINKING:
                    out += self._block(THINKING, {"type": "thinking", "thinking": "", "signature": ""})
                out += self._delta({"type": "thinking_delta", "thinking": reasoning})
            if delta.get("content"):
                if self.open != TEXT:
                    out += self._block(TEXT, {"type": "text", "text": ""})
                out += self._delta({"type": "text_delta", "text": delta["content"]})
            for call in delta.get("tool_calls") or ():
                function = call.get("function") or {}
                opened = ("tool_use", call.get("index", 0))
                if self.open != opened:
                    out += self._block(opened, {"type": "tool_use", "id": call.get("id") or "",
                                                "name": function.get("name") or "", "input": {}})
                if function.get("arguments"):
                    self.arguments.append(function["arguments"])
        return out

    def finish(self, payload: dict[str, Any], tokens: tuple[int, int], done: Event | None) -> bytes:
        if done is None:
            return self.error(*ENDED_EARLY)
        if self.failed:  # the engine's [DONE] after an error: the error event was the stream's end
            return b""
        output = Output.from_chat(payload, *tokens)
        out = (b"" if self.started else self._start(output.prompt_tokens)) + self._stop_block()
        stop_reason, stop_sequence = stop_of(output)
        out += sse("message_delta", {"type": "message_delta",
                                     "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                                     "usage": {"output_tokens": output.completion_tokens}})
        self.final = build(self.body, output, self.call_id)
        return out + STOP

    def error(self, status: int, message: str, kind: str, code: str | None, event: Event | None = None) -> bytes:
        if self.failed:
            return b""
        self.failed = True
        return sse("error", error_body(status, message))
