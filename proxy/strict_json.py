"""The one set of rules by which the proxy reads a JSON request body, and writes the body it sends onward
(proxy/boundary.py says where they apply and why)."""
from __future__ import annotations

import json
import re
from typing import Any

import orjson

from proxy.errors import InvalidRequest, ProxyError
from proxy.limits import MAX_JSON_DEPTH


def read_json_object(raw: bytes, error: type[ProxyError] = InvalidRequest) -> dict[str, Any]:
    """A request body that must be one JSON object, read by the boundary's rules (proxy/boundary.py). orjson refuses the
    non-standard numbers, the BOM, other encodings, invalid UTF-8 and lone surrogates by itself; nesting and
    repeated keys are checked here."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc):  # past orjson's own 1,024 levels
            raise _too_deep(error) from None
        raise error(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise error("request body must be a JSON object", code="invalid_json")
    depth, keys, colons = _shape(body)
    if depth > MAX_JSON_DEPTH:
        raise _too_deep(error)
    key = repeated_key(raw, keys, colons)
    if key is not None:
        raise error(f"request body is not valid JSON: the key {key[:256]!r} appears twice in one object",
                    code="invalid_json")
    return body


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


def _shape(body: dict[str, Any]) -> tuple[int, int, int]:
    """How deeply `body` nests (itself: level 1; counted up to one past `MAX_JSON_DEPTH`), how many keys its
    objects hold, and how many colons its strings (keys included) hold: one walk, level by level (no recursion
    to run out of)."""
    depth = keys = colons = 0
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
        level = below
    return depth, keys, colons


def engine_bytes(body: dict[str, Any]) -> bytes:
    """What the engine is sent: the checked object, serialised by the proxy."""
    return orjson.dumps(body)
