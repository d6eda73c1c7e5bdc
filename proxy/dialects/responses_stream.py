"""The engine's chat stream as the Responses API's event stream.

The sequence is the one the official SDKs parse: `response.created`, `response.in_progress`, then per output item
`response.output_item.added` … its deltas (`response.output_text.delta`, `response.function_call_arguments.delta`,
`response.reasoning_text.delta`) … its `.done` events and `response.output_item.done`, and last
`response.completed` (or `response.incomplete` when `max_output_tokens` cut it short) with the whole Response.
Every event carries a `sequence_number`; an error becomes an `error` event.
"""
from __future__ import annotations

from typing import Any

from proxy.dialects import responses as R
from proxy.dialects.base import Output, sse


class _Item:
    def __init__(self, output_index: int, item: dict[str, Any]) -> None:
        self.output_index = output_index
        self.item = item
        self.text: list[str] = []
        self.logprobs: list[dict[str, Any]] = []
        self.done = False


class ResponsesStream:
    def __init__(self, dialect: "R.ResponsesDialect", body: dict[str, Any], call_id: str, created: int) -> None:
        self.dialect = dialect
        self.body = body
        self.call_id = call_id
        self.created = created
        self.sequence = 0
        self.started = False
        self.items: list[_Item] = []
        self.message: _Item | None = None
        self.reasoning: _Item | None = None
        self.tools: dict[int, _Item] = {}
        self.final: dict[str, Any] | None = None  # the whole Response, once finished
        self.want_logprobs = R.wants_logprobs(body)

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return sse(kind, payload)

    def _start(self) -> bytes:
        self.started = True
        snapshot = R.skeleton(self.body, self.call_id, self.created)
        return self._event("response.created", response=snapshot) + self._event("response.in_progress",
                                                                                response=snapshot)

    def _open(self, item: dict[str, Any]) -> _Item:
        opened = _Item(len(self.items), item)
        self.items.append(opened)
        return opened

    def feed(self, chunk: dict[str, Any], prompt_tokens: int) -> bytes:
        out = b"" if self.started else self._start()
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning") or delta.get("reasoning_content")
            if reasoning:
                out += self._reasoning_delta(reasoning)
            if delta.get("content"):
                logprobs = (choice.get("logprobs") or {}).get("content") if self.want_logprobs else None
                out += self._text_delta(delta["content"], logprobs or [])
            for call in delta.get("tool_calls") or ():
                out += self._tool_delta(call)
        return out

    def _reasoning_delta(self, text: str) -> bytes:
        out = b""
        if self.reasoning is None:
            self.reasoning = self._open({"id": f"rs_{self.call_id}", "type": "reasoning", "summary": [],
                                         "content": [], "status": "in_progress"})
            out += self._event("response.output_item.added", output_index=self.reasoning.output_index,
                               item=self.reasoning.item)
        self.reasoning.text.append(text)
        return out + self._event("response.reasoning_text.delta", item_id=self.reasoning.item["id"],
                                 output_index=self.reasoning.output_index, content_index=0, delta=text)

    def _text_delta(self, text: str, logprobs: list[dict[str, Any]]) -> bytes:
        out = self._close(self.reasoning)
        if self.message is None:
            self.message = self._open({"id": f"msg_{self.call_id}", "type": "message", "status": "in_progress",
                                       "role": "assistant", "content": []})
            out += self._event("response.output_item.added", output_index=self.message.output_index,
                               item=self.message.item)
            out += self._event("response.content_part.added", item_id=self.message.item["id"],
                               output_index=self.message.output_index, content_index=0,
                               part=R.text_part("", None))
        self.message.text.append(text)
        self.message.logprobs += logprobs
        return out + self._event("response.output_text.delta", item_id=self.message.item["id"],
                                 output_index=self.message.output_index, content_index=0, delta=text,
                                 logprobs=R.response_logprobs(logprobs))

    def _tool_delta(self, call: dict[str, Any]) -> bytes:
        out = self._close(self.reasoning) + self._close(self.message)
        index = call.get("index", len(self.tools))
        function = call.get("function") or {}
        slot = self.tools.get(index)
        if slot is None:
            start = {"id": call.get("id"), "function": {"name": function.get("name") or "", "arguments": ""}}
            slot = self.tools[index] = self._open(R.tool_item(self.body, self.call_id, index, start, "in_progress"))
            out += self._event("response.output_item.added", output_index=slot.output_index, item=slot.item)
        arguments = function.get("arguments")
        if arguments:
            slot.text.append(arguments)
            if slot.item["type"] == "function_call":
                out += self._event("response.function_call_arguments.delta", item_id=slot.item["id"],
                                   output_index=slot.output_index, delta=arguments)
        return out

    def _close(self, opened: _Item | None, status: str = "completed") -> bytes:
        if opened is None or opened.done:
            return b""
        opened.done = True
        item, index, text = opened.item, opened.output_index, "".join(opened.text)
        out = b""
        if item["type"] == "message":
            part = R.text_part(text, opened.logprobs)
            item.update(R.message_item(self.call_id, text, opened.logprobs, status))
            out += self._event("response.output_text.done", item_id=item["id"], output_index=index,
                               content_index=0, text=text, logprobs=part["logprobs"])
            out += self._event("response.content_part.done", item_id=item["id"], output_index=index,
                               content_index=0, part=part)
        elif item["type"] == "reasoning":
            item.update(R.reasoning_item(self.call_id, text))
            out += self._event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                               content_index=0, text=text)
        elif item["type"] == "function_call":
            item.update(arguments=text, status="completed")
            out += self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                               name=item["name"], arguments=text)
        else:  # a custom tool's input is known whole only at its end
            item.update(input=R.custom_input(text), status="completed")
        return out + self._event("response.output_item.done", output_index=index, item=item)

    def finish(self, output: Output) -> bytes:
        out = b"" if self.started else self._start()
        if not self.items:  # the model said nothing: an empty message, as in the non-streamed answer
            out += self._text_delta("", [])
        incomplete = output.finish_reason == "length"
        for opened in self.items:
            out += self._close(opened, "incomplete" if incomplete else "completed")
        response = self.dialect.build_response(self.body, output, self.call_id, self.created)
        response["output"] = [opened.item for opened in self.items]  # what the stream said, in its order
        self.final = response
        final = "response.incomplete" if incomplete else "response.completed"
        return out + self._event(final, response=response)

    def error(self, status: int, message: str, kind: str, code: str | None) -> bytes:
        return self._event("error", code=code or kind, message=message, param=None)
