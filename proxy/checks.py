"""In what order a request is checked, in one place: the middleware every request passes, outermost first
(`middlewares`), then, on a recorded call's route, the checks of its body in the order
`proxy/serving.py` `CompletionServing.handle` runs them (`BODY_CHECKS`). docs/architecture.md shows the same list;
tests/api/test_check_order.py holds both against the code.

Middleware (`middlewares`), each seeing what the one before let through:

    close_refused     a refused request's connection is closed, not kept alive (proxy/edge/uploads.py)
    body_deadline     the whole body must arrive within `--body-timeout` (proxy/edge/uploads.py)
    api_errors        every error below leaves in the route's own shape: Anthropic's on the Messages routes,
                      Google's on the Gemini API's, OpenAI's elsewhere; store and database errors mapped to
                      their statuses (this module)
    valid_host        the Host header names this server (proxy/edge/http_server.py)
    authenticate      who is calling: a key, its project, or none where keys are off (proxy/edge/auth.py)
    enforce_limits    the key's request rate, its open requests, the body's size, coding and inflation, the
                      project's stored bytes (proxy/edge/limits.py)
    scope_rollouts    a rollout in the path is the caller's own (proxy/edge/auth.py)

A route's body is then read by one set of JSON rules (proxy/strict_json.py) and checked by the request boundary
(proxy/boundary.py); on a recorded call (chat, completions, Responses, Messages) in the order `BODY_CHECKS` lists."""
from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as SQLAlchemyTimeout

from core.settings import ProxySettings
from core.text import printable
from proxy.api import hint
from proxy.dialects.gemini_objects import error_body as google_error_body
from proxy.dialects.messages_objects import error_body as anthropic_error_body
from proxy.edge import (
    AUTH,
    LIMITS,
    Authenticator,
    Limits,
    authenticate,
    body_deadline,
    close_refused,
    enforce_limits,
    scope_rollouts,
    valid_host,
)
from proxy.errors import ConflictError, Forbidden, NotFoundError, ProxyError, StoreUnavailable, json_response
from proxy.metrics import ProxyMetrics
from proxy.routes.gemini import in_gemini_api
from proxy.routes.messages import in_messages_api
from proxy.state import STATE
from store import errors as store_errors

log = logging.getLogger("rlproxy.proxy")

# (what CompletionServing.handle calls, what it refuses), in the order it calls them; a step that fails answers
# the agent in its route's error shape and nothing after it runs (no engine call, no record).
BODY_CHECKS: tuple[tuple[str, str], ...] = (
    ("parse_json_object", "not one JSON object by the strict rules: nesting, size, NaN, repeated keys (400)"),
    ("boundary.check_common", "a field that steers the engine, one the route does not take (400)"),
    ("boundary.budget.check", "max_tokens or n past the operator's budget (400)"),
    ("dialect.validate", "the wire format's own request model: types, roles, the route's rules (400)"),
    ("self.access.check", "a model the key's project may not call, as if it did not exist (404)"),
    ("boundary.check_media", "media in the prompt the operator does not allow fetched (400)"),
    ("self.router.route_call", "the policy the call goes to: named, default or base (404 for none)"),
    ("resample", "the operator's rollout sampling applied to a training rollout's call"),
    ("boundary.budget.bound", "the engine's body within the token budget, its context length"),
    ("claim_for_call", "the rollout claimed for this key's project; only a checked call claims (403, 409)"),
)

HTTP_ERROR_TYPES = {404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error"}


def middlewares(settings: ProxySettings) -> list:
    """The middleware of the application, outermost first (this module's opening lists what each checks)."""
    return [close_refused, body_deadline(settings.body_timeout), api_errors, valid_host,
            authenticate, enforce_limits, scope_rollouts]


def install(app: web.Application, settings: ProxySettings, metrics: ProxyMetrics | None = None) -> None:
    """What the keys and limits middleware read: the authenticator and the limits. Whether keys are needed is
    settled at startup, once the database is reachable (`Authenticator.start`)."""
    app[AUTH] = Authenticator(settings.auth)
    app[LIMITS] = Limits(settings, metrics)

    async def start_auth(app: web.Application) -> None:  # on_startup runs after the cleanup contexts started
        await app[AUTH].start(app[STATE].sessions, settings.host)

    app.on_startup.append(start_auth)


@web.middleware
async def api_errors(request: web.Request, handler):
    """Every error leaves as a JSON body in the route's own shape (Anthropic's on the Messages routes, Google's on
    the Gemini API's, OpenAI's everywhere else); lower-level errors are mapped here, at the edge."""
    try:
        return await handler(request)
    except ProxyError as exc:
        error = exc
    except store_errors.NotFound as exc:
        error = NotFoundError(str(exc))
    except store_errors.Conflict as exc:
        error = ConflictError(str(exc))
    except store_errors.NotYours as exc:
        error = Forbidden(str(exc))
    except (OperationalError, InterfaceError, SQLAlchemyTimeout, ConnectionRefusedError) as exc:
        log.warning("the database did not answer %s %s: %s", request.method, logged_path(request),
                    printable(str(exc), 2000))
        error = StoreUnavailable("the database did not answer; try again shortly")
        error.headers = {"Retry-After": "1"}
    except DBAPIError as exc:
        if not store_errors.database_not_ready(exc):
            log.exception("unhandled error on %s %s", request.method, logged_path(request))
            error = ProxyError("internal error")
        else:  # the database's state (a failover, a lock, an operator), not the request: retry later
            log.warning("the database could not answer %s %s now (SQLSTATE %s): %s", request.method,
                        logged_path(request), store_errors.sqlstate(exc), printable(str(exc), 2000))
            error = StoreUnavailable(f"the database cannot answer now (SQLSTATE {store_errors.sqlstate(exc)}); "
                                     "try again shortly")
            error.headers = {"Retry-After": "1"}
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        said = f"{exc.reason}: {request.method} {request.path}"
        error = ProxyError(said + hint(request.path) if exc.status == 404 else said)
        error.status = exc.status
        error.type = HTTP_ERROR_TYPES.get(exc.status, "invalid_request_error" if exc.status < 500 else "internal_error")
        error.code = exc.status
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("unhandled error on %s %s", request.method, logged_path(request))
        error = ProxyError("internal error")
    if in_messages_api(request.path):
        return json_response(anthropic_error_body(error.status, error.message), status=error.status,
                             headers=error.headers)
    if in_gemini_api(request.path):
        return json_response(google_error_body(error.status, error.message, error.code or error.default_code),
                             status=error.status, headers=error.headers)
    return error.response()


def logged_path(request: web.Request) -> str:
    """The request's path as a log line may quote it: percent-decoded, it may hold newlines (a forged log line)
    and terminal escapes (core/text.py `printable`), and it is cut at 512 characters."""
    return printable(request.path, 512)
