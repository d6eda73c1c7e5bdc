"""What an engine's address may be, checked where a command reads it: `--upstream` on serve, train, eval and
the demo. Every caller adds the route to it (`/v1/chat/completions`, `/v1/load_lora_adapter`, `/health`), so a
URL ending in `/v1` made every call a 404 (`/v1/v1/...`) and one without a scheme failed at the first call, far
from the flag that caused it."""
from __future__ import annotations

from urllib.parse import urlsplit


def engine_url(value: str) -> str:
    """`value` as the engine's root URL (no trailing slash); ValueError naming what to give instead."""
    text = value.strip()
    try:
        parts = urlsplit(text)
        parts.port  # raises on a port that is not a number
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{value!r} is not an engine URL: give its root URL, like http://127.0.0.1:8000")
    if parts.query or parts.fragment:
        raise ValueError(f"{value!r}: an engine URL has no query or fragment (give its root URL, like "
                         f"{parts.scheme}://{parts.netloc})")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        raise ValueError(f"{value!r} ends in /v1: give the engine's root URL, without /v1 (like "
                         f"{parts.scheme}://{parts.netloc}{path[:-3]}): rlproxy adds the routes itself")
    return f"{parts.scheme}://{parts.netloc}{path}"


def engine_urls(values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(engine_url(value) for value in values)
