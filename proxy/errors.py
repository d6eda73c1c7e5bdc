"""The proxy's exception hierarchy and the OpenAI-shaped error body every route answers with.

    ProxyError
    ├── InvalidRequest      400  the OpenAI routes' malformed or ill-typed requests
    ├── Unprocessable       422  the rollout/reward routes' malformed bodies and non-finite rewards
    ├── NotFoundError       404
    ├── ConflictError       409
    ├── Unauthorized        401  no key, or one that is unknown or revoked
    ├── Forbidden           403  a valid key without the rights the route needs (admin)
    ├── PayloadTooLarge     413
    ├── UnsupportedMediaType 415 a body in a content type (or content coding) the route does not read
    ├── RequestTimeout      408  the body did not arrive within --body-timeout
    ├── ExpectationFailed   417 an `Expect` other than 100-continue
    ├── NotImplementedCoding 501 a transfer coding other than chunked
    ├── RateLimited         429  with Retry-After
    ├── StoreUnavailable    503  the database did not answer in time
    ├── UpstreamUnavailable 502  no engine reachable (after bounded retries)
    └── UpstreamTimeout     504
"""
from __future__ import annotations

import logging

from typing import Any

import orjson
from aiohttp import web

from core.errors import RlproxyError


class ProxyError(RlproxyError):
    status = 500
    type = "internal_error"
    headers: dict[str, str] | None = None
    default_code: str | None = None  # the body's `code` when the raiser gives none

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, param=self.param, code=self.code or self.default_code)

    def response(self) -> web.Response:
        return json_response(self.body(), status=self.status, headers=self.headers)


class InvalidRequest(ProxyError):
    status = 400
    type = "invalid_request_error"


class Unprocessable(ProxyError):
    status = 422
    type = "invalid_request_error"


class NotFoundError(ProxyError):
    status = 404
    type = "not_found_error"


class ConflictError(ProxyError):
    status = 409
    type = "conflict_error"


class Unauthorized(ProxyError):
    status = 401
    type = "authentication_error"
    headers = {"WWW-Authenticate": "Bearer"}
    default_code = "invalid_api_key"


class Forbidden(ProxyError):
    status = 403
    type = "permission_error"


class PayloadTooLarge(ProxyError):
    status = 413
    type = "invalid_request_error"
    default_code = "request_too_large"


class UnsupportedMediaType(ProxyError):
    status = 415
    type = "invalid_request_error"
    default_code = "unsupported_media_type"


class RequestTimeout(ProxyError):
    status = 408
    type = "invalid_request_error"
    default_code = "request_timeout"


class ExpectationFailed(ProxyError):
    status = 417
    type = "invalid_request_error"
    default_code = "expectation_failed"


class NotImplementedCoding(ProxyError):
    status = 501
    type = "invalid_request_error"
    default_code = "unsupported_transfer_encoding"


class RateLimited(ProxyError):
    """OpenAI's own shape for rate limits (type "requests"), with the seconds to wait in Retry-After."""

    status = 429
    type = "requests"
    default_code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after: int, code: str | None = None) -> None:
        super().__init__(message, code=code)
        self.headers = {"Retry-After": str(retry_after)}


class StoreUnavailable(ProxyError):
    status = 503
    type = "service_unavailable"
    default_code = "store_unavailable"


class UpstreamUnavailable(ProxyError):
    status = 502
    type = "upstream_error"
    default_code = "upstream_unavailable"


def engine_failure(what: str, exc: BaseException) -> UpstreamUnavailable:
    """The client's error for an engine that failed: what failed and the kind of failure, never the engine's
    address (aiohttp's text names its host and port: the operator's topology, which `/readyz` hides from project
    keys too, and which the call's recorded `error` would show in `GET /rollouts`). The whole text goes to the log."""
    logging.getLogger("rlproxy.upstream").warning("%s: %s: %s", what, type(exc).__name__, exc)
    return UpstreamUnavailable(f"{what} ({type(exc).__name__})")


class UpstreamTimeout(ProxyError):
    status = 504
    type = "upstream_error"
    default_code = "upstream_timeout"


def error_body(message: str, type_: str, *, param: str | None = None, code: str | int | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def json_response(payload: Any, *, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, content_type="application/json",
                        headers=headers)


def sse_error_event(error: ProxyError | dict) -> bytes:
    """An error as the last `data:` event of a stream (the status line has already been sent)."""
    body = error.body() if isinstance(error, ProxyError) else error
    return b"data: " + orjson.dumps(body) + b"\n\n"
