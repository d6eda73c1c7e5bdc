"""The engine's answer as the Responses API's: the Response whole, or the event stream.

The sequence is the one the official SDKs parse: `response.created`, `response.in_progress`, then per output item
`response.output_item.added` … its deltas (`response.output_text.delta`, `response.function_call_arguments.delta`,
`response.reasoning_text.delta`) … its `.done` events and `response.output_item.done`, and last
`response.completed` (or `response.incomplete` when `max_output_tokens` cut it short) with the whole Response.
Every event carries a `sequence_number`; a failure (the engine's error, its stream cut off) ends the stream with
an `error` event and then `response.failed`.

Each event's payload is written out in place and serialized with its head looked up (`_sse`): a helper taking
keyword fields and merging them into the payload cost more than the serialization on every event.
"""
from __future__ import annotations

import itertools
from typing import Any

import orjson

from proxy.dialects.base import ENDED_EARLY, SSE_END, Output, sse_head, unparsed, unreadable
from proxy.dialects.responses_objects import (
    build,
    custom_input,
    finished,
    message_item,
    reasoning_item,
    response_logprobs,
    skeleton,
    text_part,
    tool_item,
    wants_logprobs,
)
from proxy.dialects.sse import Event

HEADS = {kind: sse_head(kind) for kind in (
    "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
    "response.output_text.delta", "response.reasoning_text.delta", "response.function_call_arguments.delta",
    "response.output_text.done", "response.content_part.done", "response.reasoning_text.done",
    "response.function_call_arguments.done", "response.output_item.done", "response.completed",
    "response.incomplete", "response.failed", "error")}
TEXT_DELTA = HEADS["response.output_text.delta"]  # once per engine chunk: written without the lookup


def _sse(payload: dict[str, Any]) -> bytes:
    """The event whose type `payload` names, as `sse(payload["type"], payload)` writes it."""
    return HEADS[payload["type"]] + orjson.dumps(payload) + SSE_END


class _Item:
    def __init__(self, output_index: int, item: dict[str, Any]) -> None:
        self.output_index = output_index
        self.item = item
        self.text: list[str] = []
        self.logprobs: list[dict[str, Any]] = []
        self.done = False


class ResponsesStream:
    """One call's answer (proxy/dialects/base.py `Translator`)."""

    def __init__(self, body: dict[str, Any], call_id: str, created: int) -> None:
        self.body = body
        self.call_id = call_id
        self.created = created
        self.numbers = itertools.count()  # the events' sequence numbers
        self.started = False
        self.items: list[_Item] = []
        self.message: _Item | None = None
        self.reasoning: _Item | None = None
        self.tools: dict[int, _Item] = {}
        self.final: dict[str, Any] | None = None  # the whole Response, once finished
        self.want_logprobs = wants_logprobs(body)
        self.waiting_logprobs: list[dict[str, Any]] = []  # of tokens without text before the text began
        self.snapshot: dict[str, Any] | None = None  # the Response without output, as `response.created` sent it
        self.failed = False  # `response.failed` was sent: nothing follows it (the engine's [DONE] after an error)

    def _start(self) -> bytes:
        self.started = True
        self.snapshot = skeleton(self.body, self.call_id, self.created)
        snapshot = orjson.Fragment(orjson.dumps(self.snapshot))  # serialized once for both events
        return (_sse({"type": "response.created", "sequence_number": next(self.numbers), "response": snapshot})
                + _sse({"type": "response.in_progress", "sequence_number": next(self.numbers), "response": snapshot}))

    def _open(self, item: dict[str, Any]) -> tuple[_Item, bytes]:
        """A new output item, and its `response.output_item.added` event."""
        opened = _Item(len(self.items), item)
        self.items.append(opened)
        return opened, _sse({"type": "response.output_item.added", "sequence_number": next(self.numbers),
                             "output_index": opened.output_index, "item": item})

    def whole(self, payload: dict[str, Any] | None, raw: bytes, tokens: tuple[int, int]) -> bytes:
        if payload is None:
            unreadable()
        output = Output.from_chat(payload, *tokens)
        self.final = build(self.body, output, self.call_id, self.created)
        return orjson.dumps(self.final)

    def feed(self, chunk: dict[str, Any] | None, event: Event, prompt_tokens: int) -> bytes:
        if chunk is None:
            return unparsed(event)
        out = b"" if self.started else self._start()
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            get = (choice.get("delta") or {}).get
            reasoning = get("reasoning") or get("reasoning_content")
            if reasoning:
                out += self._reasoning_delta(reasoning)
            text = get("content")
            logprobs = (choice.get("logprobs") or {}).get("content") if self.want_logprobs else None
            if text:
                out += self._text_delta(text, self.waiting_logprobs + (logprobs or []))
                self.waiting_logprobs = []
            elif logprobs and not reasoning and not get("tool_calls"):
                # a token without text of its own (a split character, the end token): its logprob is the text's,
                # as in the whole Response, though no delta carries it
                (self.message.logprobs if self.message is not None else self.waiting_logprobs).extend(logprobs)
            for call in get("tool_calls") or ():
                out += self._tool_delta(call)
        return out

    def _reasoning_delta(self, text: str) -> bytes:
        out = b""
        if self.reasoning is None:
            self.reasoning, out = self._open({"id": f"rs_{self.call_id}", "type": "reasoning", "summary": [],
                                              "content": [], "status": "in_progress"})
        self.reasoning.text.append(text)
        return out + _sse({"type": "response.reasoning_text.delta", "sequence_number": next(self.numbers),
                           "item_id": self.reasoning.item["id"], "output_index": self.reasoning.output_index,
                           "content_index": 0, "delta": text})

    def _text_delta(self, text: str, logprobs: list[dict[str, Any]]) -> bytes:
        out = b"" if self.reasoning is None else self._close(self.reasoning)
        message = self.message
        if message is None:
            message, added = self._open({"id": f"msg_{self.call_id}", "type": "message", "status": "in_progress",
                                         "role": "assistant", "content": []})
            self.message = message
            out += added + _sse({"type": "response.content_part.added", "sequence_number": next(self.numbers),
                                 "item_id": message.item["id"], "output_index": message.output_index,
                                 "content_index": 0, "part": text_part("", None)})
        message.text.append(text)
        if logprobs:
            message.logprobs += logprobs
        payload = {"type": "response.output_text.delta", "sequence_number": next(self.numbers),
                   "item_id": message.item["id"], "output_index": message.output_index, "content_index": 0,
                   "delta": text, "logprobs": response_logprobs(logprobs) if logprobs else []}
        return out + TEXT_DELTA + orjson.dumps(payload) + SSE_END

    def _tool_delta(self, call: dict[str, Any]) -> bytes:
        out = self._close(self.reasoning) + self._close(self.message)
        index = call.get("index", len(self.tools))
        function = call.get("function") or {}
        slot = self.tools.get(index)
        if slot is None:
            start = {"id": call.get("id"), "function": {"name": function.get("name") or "", "arguments": ""}}
            slot, added = self._open(tool_item(self.body, self.call_id, index, start, "in_progress"))
            self.tools[index] = slot
            out += added
        arguments = function.get("arguments")
        if arguments:
            slot.text.append(arguments)
            if slot.item["type"] == "function_call":
                out += _sse({"type": "response.function_call_arguments.delta", "sequence_number": next(self.numbers),
                             "item_id": slot.item["id"], "output_index": slot.output_index, "delta": arguments})
        return out

    def _close(self, opened: _Item | None, status: str = "completed") -> bytes:
        if opened is None or opened.done:
            return b""
        opened.done = True
        item, index, text = opened.item, opened.output_index, "".join(opened.text)
        out = b""
        if item["type"] == "message":
            part = text_part(text, opened.logprobs)
            item.update(message_item(self.call_id, part, status))
            out += _sse({"type": "response.output_text.done", "sequence_number": next(self.numbers),
                         "item_id": item["id"], "output_index": index, "content_index": 0, "text": text,
                         "logprobs": part["logprobs"]})
            out += _sse({"type": "response.content_part.done", "sequence_number": next(self.numbers),
                         "item_id": item["id"], "output_index": index, "content_index": 0, "part": part})
        elif item["type"] == "reasoning":
            item.update(reasoning_item(self.call_id, text))
            out += _sse({"type": "response.reasoning_text.done", "sequence_number": next(self.numbers),
                         "item_id": item["id"], "output_index": index, "content_index": 0, "text": text})
        elif item["type"] == "function_call":
            item.update(arguments=text, status="completed")
            out += _sse({"type": "response.function_call_arguments.done", "sequence_number": next(self.numbers),
                         "item_id": item["id"], "output_index": index, "name": item["name"], "arguments": text})
        else:  # a custom tool's input is known whole only at its end
            item.update(input=custom_input(text), status="completed")
        return out + _sse({"type": "response.output_item.done", "sequence_number": next(self.numbers),
                           "output_index": index, "item": item})

    def finish(self, payload: dict[str, Any], tokens: tuple[int, int], done: Event | None) -> bytes:
        if done is None:
            return self.error(*ENDED_EARLY)
        if self.failed:
            return b""
        out = b"" if self.started else self._start()
        if not self.items:  # the model said nothing: an empty message, as in the non-streamed answer
            out += self._text_delta("", [])
        output = Output.from_chat(payload, *tokens)
        incomplete = output.finish_reason == "length"
        for opened in self.items:
            out += self._close(opened, "incomplete" if incomplete else "completed")
        # The Response `build` would make, with the output the stream said, in its order.
        response = finished({**self.snapshot}, output, [opened.item for opened in self.items])
        self.final = response
        final = "response.incomplete" if incomplete else "response.completed"
        return out + _sse({"type": final, "sequence_number": next(self.numbers), "response": response})

    def error(self, status: int, message: str, kind: str, code: str | None, event: Event | None = None) -> bytes:
        """The stream's end when the call fails: an `error` event (what this stream has always sent), then
        `response.failed` with the Response as far as it got (the items it finished) and the error, as the API
        ends a failed response, so a client waiting for the Response's last state gets one."""
        if self.failed:
            return b""
        self.failed = True
        out = b"" if self.started else self._start()
        out += _sse({"type": "error", "sequence_number": next(self.numbers), "code": code or kind,
                     "message": message, "param": None})
        self.final = {**self.snapshot, "status": "failed", "error": {"code": code or kind, "message": message},
                      "output": [opened.item for opened in self.items if opened.done]}
        return out + _sse({"type": "response.failed", "sequence_number": next(self.numbers), "response": self.final})
