"""The one set of rules by which the proxy reads a JSON request body, and writes the body it sends onward
(proxy/boundary.py says where they apply and why), with the bounds of a JSON body: how many values and containers
it may hold and how deeply it may nest. Everything that parses JSON an agent sent imports them from here."""
from __future__ import annotations

import json
import re
from typing import Any

import orjson

from core.checks import nests_deeper_than
from proxy.errors import InvalidRequest, PayloadTooLarge, ProxyError

MAX_JSON_VALUES = 1_000_000
"""The most values (of any kind) a JSON body may hold, bounded before it is parsed (proxy/strict_json.py). A
128k-token prompt sent as token ids is 128k values; a million values parse and are walked (proxy/strict_json.py
`_shape`) in about 0.3 s on a loaded 2-core machine."""
MAX_JSON_CONTAINERS = 200_000
"""The most arrays and objects a JSON body may hold, bounded before it is parsed. Containers are what parsing
pays for (a Python list or dict each): a million empty lists, 3 MB of `[],`, took 0.66 s of the event loop, and
64 MiB of them would hold it for 10-20 s and take 2 GB, whatever the route later thinks of the body."""
MAX_JSON_DEPTH = 64
"""The deepest nesting of arrays and objects accepted in a JSON body (the body itself is level 1). orjson reads
up to 1,024 levels but writes only up to 254, and every call is written again: to the engine, to the spool, to
the database. A body that could be read but not written would fail after it was answered, where no error can
reach its sender. Agents' bodies, JSON schemas of tools included, stay far below 64."""


def too_deep(value: Any, raw: bytes | None = None, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether parsed JSON `value` nests deeper than `limit`. With the `raw` bytes it came from, most bodies are
    cleared at once: nesting cannot exceed the number of opening brackets."""
    if raw is not None and raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    return nests_deeper_than(value, limit)


def read_json_object(raw: bytes, error: type[ProxyError] = InvalidRequest) -> dict[str, Any]:
    """A request body that must be one JSON object, read by the boundary's rules (proxy/boundary.py). orjson refuses the
    non-standard numbers, the BOM, other encodings, invalid UTF-8 and lone surrogates by itself; nesting and
    repeated keys are checked here."""
    check_structure(raw)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc):  # past orjson's own 1,024 levels
            raise _too_deep(error) from None
        raise error(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise error("request body must be a JSON object", code="invalid_json")
    depth, keys, colons, numbers = _shape(body)
    if depth > MAX_JSON_DEPTH:
        raise _too_deep(error)
    if numbers.wide or (numbers.floats and _long_integer_literal(raw)):
        raise error("request body holds an integer beyond 64 bits (-2^63 to 2^63-1 are taken): it would reach "
                    "the engine as a rounded float, not as sent", code="number_too_large")
    key = repeated_key(raw, keys, colons)
    if key is not None:
        raise error(f"request body is not valid JSON: the key {key[:256]!r} appears twice in one object",
                    code="invalid_json")
    return body


def check_structure(raw: bytes, max_values: int = MAX_JSON_VALUES, max_containers: int = MAX_JSON_CONTAINERS) -> None:
    """Refuse (413) a body that would hold more than `max_values` values or `max_containers` arrays and objects,
    counted on the bytes before anything is parsed. Counting bytes is fast (GB/s); only a body whose raw count
    passes a bound is counted again with its strings blanked (a prompt full of commas or brackets is not many
    values), and a body with more strings than `max_values` is refused before that (every string is a value).
    A body no longer than both bounds is not counted at all: every value and container takes a byte at least (the
    three counts were 40-100 us of a 42 KB body's read, more than parsing it)."""
    if len(raw) <= max_values and len(raw) <= max_containers:
        return
    containers = raw.count(b"[") + raw.count(b"{")
    values = raw.count(b",") + containers
    if values <= max_values and containers <= max_containers:
        return
    if (raw.count(b'"') - raw.count(b'\\"')) // 2 > max_values:
        raise _too_many(f"more than {max_values} values")
    values, containers = json_structure(raw)
    if values > max_values:
        raise _too_many(f"more than {max_values} values")
    if containers > max_containers:
        raise _too_many(f"more than {max_containers} arrays and objects")


def _too_many(what: str) -> ProxyError:
    return PayloadTooLarge(f"request body holds {what}; send less in one request", code="too_many_values")


def json_structure(body: bytes) -> tuple[int, int]:
    """At least the number of values and of arrays and objects `body` holds, were it JSON, counted without parsing
    it: every value but the first follows a comma or an opening bracket outside a string. Those inside strings are
    not counted; in a body with an unterminated string (not JSON: refused by the parser) all are. Byte operations
    only (C speed, no pattern to backtrack): escaped backslashes, then escaped quotes, are blanked, so every quote
    left opens or closes a string, and the text between every other pair is outside the strings."""
    text = body.replace(b"\\\\", b"__").replace(b'\\"', b"__")
    parts = text.split(b'"')
    outside = b"".join(parts[0::2]) if len(parts) % 2 else text
    containers = outside.count(b"{") + outside.count(b"[")
    return outside.count(b",") + containers, containers


def json_values_bound(body: bytes) -> int:
    """At least the number of values `body` holds (see `json_structure`)."""
    return json_structure(body)[0]


def _too_deep(error: type[ProxyError]) -> ProxyError:
    return error(f"request body nests arrays and objects more than {MAX_JSON_DEPTH} levels deep",
                 code="json_too_deep")


def repeated_key(raw: bytes, keys: int, colons: int) -> str | None:
    """A key that appears twice in one object of `raw`, whose parsed objects hold `keys` keys and whose parsed
    strings (keys included) hold `colons` colons; or None.

    Counted, not parsed again: in JSON text a colon is either the separator after a key (one per key) or a
    character inside a string (a colon byte never occurs inside another UTF-8 character), and a string can
    spell a colon otherwise only as the escape `\\u003a`. So for text without that escape, the text's colons less
    the colons in the parsed strings are its keys, and when they are as many as the parsed objects hold, no
    key was lost. Any other text is read again with Python's parser, which shows every pair (and names the key)."""
    if raw.count(b":") - colons == keys and (b"\\u003" not in raw or not re.search(rb"\\u003[aA]", raw)):
        return None
    repeated: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> None:
        if len(items) > 1 and not repeated:
            seen: set[str] = set()
            for key, _ in items:
                if key in seen:
                    repeated.append(key)
                    break
                seen.add(key)

    json.loads(raw, object_pairs_hook=pairs)  # valid JSON, ≤ MAX_JSON_DEPTH deep: orjson read it already
    return repeated[0] if repeated else None


class _Numbers:
    """What a walk saw of the numbers: an int past 64 bits (orjson reads up to 2^64-1 as int), a float of 2^63 or
    more in size (orjson reads an integer literal past 64 bits as one; only the text tells it from `1e23`)."""

    __slots__ = ("wide", "floats")

    def __init__(self) -> None:
        self.wide = self.floats = False


INT64 = range(-(1 << 63), 1 << 63)
BIG = float(1 << 63)
_LONG_INTEGER = re.compile(rb"(?<![\d.eE+\-])-?\d{19,}(?![\d.eE])")  # 19+ digits: past 64 bits or near it


def _long_integer_literal(raw: bytes) -> bool:
    """Whether `raw` spells, outside its strings, an integer literal past 64 bits (orjson turned it into a
    float). Strings are blanked first (a prompt full of digits is no number)."""
    text = raw.replace(b"\\\\", b"__").replace(b'\\"', b"__")
    outside = b" ".join(text.split(b'"')[0::2])
    return any(int(m.group()) not in INT64 for m in _LONG_INTEGER.finditer(outside))


def _shape(body: dict[str, Any]) -> tuple[int, int, int, _Numbers]:
    """How deeply `body` nests (itself: level 1; counted up to one past `MAX_JSON_DEPTH`), how many keys its
    objects hold, how many colons its strings (keys included) hold, and what its numbers are: one walk, level by
    level (no recursion to run out of)."""
    depth = keys = colons = 0
    numbers = _Numbers()
    level: list[Any] = [body]
    while level and depth <= MAX_JSON_DEPTH:
        depth += 1
        below: list[Any] = []
        for item in level:
            if type(item) is dict:
                keys += len(item)
                for key in item:
                    colons += key.count(":")
                children = item.values()
            else:
                children = item
            for child in children:
                kind = type(child)
                if kind is str:
                    colons += child.count(":")
                elif kind is dict or kind is list:
                    below.append(child)
                elif kind is int:
                    numbers.wide = numbers.wide or child not in INT64
                elif kind is float and not -BIG < child < BIG:  # what an integer literal past 64 bits becomes
                    numbers.floats = True
        level = below
    return depth, keys, colons, numbers


def engine_bytes(body: dict[str, Any]) -> bytes:
    """What the engine is sent: the checked object, serialised by the proxy."""
    return orjson.dumps(body)
