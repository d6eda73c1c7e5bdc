"""The engine's key on every route, not only vLLM's guarded prefixes.

vLLM checks its API key (``VLLM_API_KEY``) only on paths under ``/v1``, ``/v2``, ``/inference`` and ``/cohere``.
Its server registers more than those: ``POST /adapters`` loads a LoRA from any path the engine can read (the
same handler as ``/v1/load_lora_adapter``), ``POST /invocations`` generates, ``/tokenize``, ``/detokenize`` and
``/scale_elastic_ep`` answer too, all without the key. Anyone who reaches the engine's port could then replace
what an adapter name serves, or sample from it unrecorded, whatever key the engine was given.

`RequireEngineKey` is an ASGI middleware that vLLM loads itself (``--middleware
engine.route_guard.RequireEngineKey``, added by engine/command.py whenever the engine has a key, and by the Helm
chart, which mounts this file into vLLM's image). With a key set it denies by default: every request needs
``Authorization: Bearer <key>`` except the probes a kubelet or Prometheus makes without one (`OPEN_PATHS`) and
CORS preflights (``OPTIONS``, which run no handler). Without a key it does nothing: such an engine is open by
the operator's choice (`rlproxy engine` binds to loopback unless told otherwise).

This file imports nothing outside the standard library, and nothing of ours: it runs inside vLLM's process and
image, where only it is mounted.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os

# Read without a key: liveness/readiness probes and metrics scrapes (they carry no credentials in the chart).
OPEN_PATHS = frozenset({"/health", "/ping", "/metrics", "/version", "/load"})

_DENIED = json.dumps({"error": {"message": "this engine requires its API key on every route",
                                "type": "authentication_error", "code": 401}}).encode()


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


class RequireEngineKey:
    """Every HTTP or WebSocket request but `OPEN_PATHS` and ``OPTIONS`` needs the engine's bearer key."""

    def __init__(self, app, key: str | None = None) -> None:
        self.app = app
        key = key if key is not None else os.environ.get("VLLM_API_KEY", "")
        self._key = _digest(key.encode()) if key else None

    def _authorized(self, scope) -> bool:
        for name, value in scope.get("headers") or ():
            if name.lower() == b"authorization":
                scheme, _, token = value.partition(b" ")
                # one comparison of equal-length digests: the time taken says nothing about the key
                return scheme.lower() == b"bearer" and hmac.compare_digest(_digest(token.strip()), self._key)
        return False

    async def __call__(self, scope, receive, send) -> None:
        if (self._key is None or scope["type"] not in ("http", "websocket") or scope.get("method") == "OPTIONS"
                or scope.get("path") in OPEN_PATHS or self._authorized(scope)):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # policy violation, before accepting
            return
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(_DENIED)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": _DENIED})
