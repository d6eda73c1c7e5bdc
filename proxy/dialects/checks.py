"""Cheap exact checks that a parsed JSON body is valid, before the pydantic models of the dialects.

Validating with a pydantic model costs several microseconds on every request (the Messages model copies every
message), and nearly every body passes. Each check here looks at the fields its model constrains and says yes
only for a body the model certainly accepts; a body it does not vouch for is validated by the model, which
accepts it or names the problem. So every body gets the same answer, only sooner.

A parsed JSON body's values are exactly str, int, float, bool, list, dict (with str keys) or None, so `type(x)
is int` is pydantic's StrictInt (a bool is not an int there), and `type(x) is str` its StrictStr.
"""
from __future__ import annotations

from typing import Any


def absent_or(value: Any, kind: type) -> bool:
    """The value is missing (None), or exactly of `kind`."""
    return value is None or type(value) is kind


def plainly_valid_responses(body: dict[str, Any]) -> bool:
    """`proxy.dialects.responses.ResponsesRequest` certainly accepts `body`."""
    get = body.get
    model, value, tokens, tools = get("model"), get("input"), get("max_output_tokens"), get("tools")
    return (type(model) is str and model != "" and (type(value) is str or (type(value) is list and value != []))
            and absent_or(get("instructions"), str) and absent_or(get("previous_response_id"), str)
            and absent_or(get("stream"), bool) and absent_or(get("store"), bool)
            and absent_or(get("background"), bool) and (tokens is None or (type(tokens) is int and tokens >= 1))
            and absent_or(get("text"), dict) and absent_or(get("include"), list)
            and (tools is None or (type(tools) is list and all(type(tool) is dict for tool in tools))))


def plainly_valid_messages(body: dict[str, Any]) -> bool:
    """`proxy.dialects.messages.MessagesRequest` certainly accepts `body`."""
    get = body.get
    model, tokens, messages, stops, tools = (get("model"), get("max_tokens"), get("messages"),
                                             get("stop_sequences"), get("tools"))
    return (type(model) is str and model != "" and type(tokens) is int and tokens >= 1
            and type(messages) is list and messages != [] and all(type(m) is dict for m in messages)
            and absent_or(get("stream"), bool) and absent_or(get("metadata"), dict)
            and (stops is None or (type(stops) is list and all(type(stop) is str for stop in stops)))
            and (tools is None or (type(tools) is list and all(type(tool) is dict for tool in tools))))
