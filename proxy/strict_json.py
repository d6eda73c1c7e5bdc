"""The one set of rules by which the proxy reads a JSON request body, and writes the body it sends onward
(proxy/boundary.py says where they apply and why)."""
from __future__ import annotations

import json
from typing import Any

import orjson

from proxy.errors import InvalidRequest, ProxyError
from proxy.limits import MAX_JSON_DEPTH, too_deep


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
    if too_deep(body, raw):
        raise _too_deep(error)
    key = repeated_key(body, raw)
    if key is not None:
        raise error(f"request body is not valid JSON: the key {key[:256]!r} appears twice in one object",
                    code="invalid_json")
    return body


def _too_deep(error: type[ProxyError]) -> ProxyError:
    return error(f"request body nests arrays and objects more than {MAX_JSON_DEPTH} levels deep",
                 code="json_too_deep")


def repeated_key(body: dict[str, Any], raw: bytes) -> str | None:
    """A key that appears twice in one object of `raw` (parsed as `body`, which kept one of them), or None.

    Most bodies are cleared by counting: every key in the raw text is followed by a colon, and a colon appears
    elsewhere only inside strings, so when the raw text holds no more colons than the parsed objects hold keys,
    no key was lost. Otherwise the text is read again with Python's parser, which shows every pair."""
    if raw.count(b":") == _key_count(body):
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


def _key_count(value: Any) -> int:
    count, pending = 0, [value]
    while pending:
        item = pending.pop()
        if type(item) is dict:
            count += len(item)
            pending.extend(child for child in item.values() if type(child) is dict or type(child) is list)
        elif type(item) is list:
            pending.extend(child for child in item if type(child) is dict or type(child) is list)
    return count


def engine_bytes(body: dict[str, Any]) -> bytes:
    """What the engine is sent: the checked object, serialised by the proxy."""
    return orjson.dumps(body)
