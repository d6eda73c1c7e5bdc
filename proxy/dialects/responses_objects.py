"""The Responses API's Response object and its output items, built from the engine's answer: whole
(`build`), or piece by piece as the stream (proxy/dialects/responses_stream.py) sends them."""
from __future__ import annotations

from typing import Any

import orjson

from core.responses_chat import CUSTOM_INPUT_KEY
from proxy.dialects.base import Output


def wants_logprobs(body: dict[str, Any]) -> bool:
    """Whether the agent asked for the output text's logprobs (the proxy asks the engine for them on its own)."""
    return "message.output_text.logprobs" in (body.get("include") or ())


def response_id(call_id: str) -> str:
    return f"resp_{call_id}"


def skeleton(body: dict[str, Any], call_id: str, created: int) -> dict[str, Any]:
    """The Response object without its output: what `response.created` carries, and what the final one starts
    from. It echoes the request's settings, as the API does."""
    return {
        "id": response_id(call_id), "object": "response", "created_at": created, "status": "in_progress",
        "background": False, "error": None, "incomplete_details": None,
        "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": body.get("max_tool_calls"), "model": body["model"], "output": [],
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
        "service_tier": body.get("service_tier") or "auto", "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0), "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
        "top_logprobs": body.get("top_logprobs"), "top_p": body.get("top_p", 1.0),
        "truncation": body.get("truncation") or "disabled",  # as asked: "auto" is carried (proxy/dialects/reasoning.py)
        "usage": None, "user": body.get("user"), "metadata": body.get("metadata") or {},
    }


def usage(output: Output) -> dict[str, Any]:
    return {"input_tokens": output.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": output.prompt_tokens + output.completion_tokens}


def finished(response: dict[str, Any], output: Output, items: list[dict[str, Any]]) -> dict[str, Any]:
    """A `skeleton` completed with its output `items`, status and usage: the Response the agent receives."""
    incomplete = output.finish_reason == "length"
    response["output"] = items
    response["status"] = "incomplete" if incomplete else "completed"
    response["incomplete_details"] = {"reason": "max_output_tokens"} if incomplete else None
    response["usage"] = usage(output)
    return response


def message_item(call_id: str, part: dict[str, Any], status: str) -> dict[str, Any]:
    """The assistant message item holding one `text_part`."""
    return {"id": f"msg_{call_id}", "type": "message", "status": status, "role": "assistant", "content": [part]}


def text_part(text: str, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": response_logprobs(logprobs)}


def response_logprobs(entries: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Chat logprobs entries in the Responses form (the same fields, nested top_logprobs without `bytes` lists
    of their own kept as they came)."""
    return [{"token": e.get("token"), "logprob": e.get("logprob"), "bytes": e.get("bytes") or [],
             "top_logprobs": [{"token": t.get("token"), "logprob": t.get("logprob"), "bytes": t.get("bytes") or []}
                              for t in e.get("top_logprobs") or ()]}
            for e in entries or ()]


def tool_item(body: dict[str, Any], call_id: str, index: int, call: dict[str, Any], status: str) -> dict[str, Any]:
    """A chat tool call as a `function_call` item, or a `custom_tool_call` for a custom tool's name."""
    function = call.get("function") or {}
    name, arguments = function.get("name") or "", function.get("arguments") or ""
    item_id, tool_call_id = f"fc_{call_id}_{index}", call.get("id") or f"call_{call_id}_{index}"
    if name in custom_tool_names(body):
        return {"id": item_id, "type": "custom_tool_call", "status": status, "call_id": tool_call_id,
                "name": name, "input": custom_input(arguments)}
    return {"id": item_id, "type": "function_call", "status": status, "call_id": tool_call_id, "name": name,
            "arguments": arguments}


def custom_tool_names(body: dict[str, Any]) -> set[str]:
    return {t.get("name") for t in body.get("tools") or () if isinstance(t, dict) and t.get("type") == "custom"}


def custom_input(arguments: str) -> str:
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    value = parsed.get(CUSTOM_INPUT_KEY) if isinstance(parsed, dict) else None
    return value if isinstance(value, str) else arguments


def reasoning_item(call_id: str, text: str) -> dict[str, Any]:
    return {"id": f"rs_{call_id}", "type": "reasoning", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}], "status": "completed"}


def output_items(body: dict[str, Any], output: Output, call_id: str) -> list[dict[str, Any]]:
    items = []
    if output.reasoning:
        items.append(reasoning_item(call_id, output.reasoning))
    # an answer that is all reasoning (a thinking model cut off by max_output_tokens) has no message item, as
    # in vLLM's own route and this stream (proxy/dialects/responses_stream.py)
    if output.text or not (output.tool_calls or output.reasoning):
        status = "incomplete" if output.finish_reason == "length" else "completed"
        logprobs = output.logprobs if wants_logprobs(body) else None  # the proxy asks for them on its own
        items.append(message_item(call_id, text_part(output.text or "", logprobs), status))
    items += [tool_item(body, call_id, i, call, "completed") for i, call in enumerate(output.tool_calls)]
    return items


def build(body: dict[str, Any], output: Output, call_id: str, created: int) -> dict[str, Any]:
    """The Response the agent receives for a finished call."""
    return finished(skeleton(body, call_id, created), output, output_items(body, output, call_id))
