"""The edge: what a request meets before any route reads it. The HTTP server's own bounds (http_server.py: the
router, the host check, the guarded request handler), uploads (uploads.py: the body's deadline, its size, its
coding, `Expect: 100-continue`), who is calling (auth.py: keys, projects, rollout ownership, over access.py's
table of what each route needs; token_scope.py: what a rollout's own token may reach; the engine routes relayed
as they are: engine_routes.py), and the limits per key (limits.py over buckets.py's token buckets and
storage_budget.py's stored bytes per project). proxy/checks.py names the order in which all of them run.

This is the wing's one door: the rest of the proxy imports only what this module exports, never a module inside."""
from __future__ import annotations

from proxy.edge.access import AUTH
from proxy.edge.auth import (
    AuthConfigError,
    Authenticator,
    authenticate,
    claim_for_call,
    is_loopback,
    operator_caller,
    resolve_auth,
    scope_rollouts,
)
from proxy.edge.engine_routes import FIELDS, RELAYED
from proxy.edge.http_server import Router, use_guarded_handler, valid_host
from proxy.edge.limits import LIMITS, Limits, enforce_limits
from proxy.edge.token_scope import may_create_eval, own_rollout, reward_giver, token_rollout
from proxy.edge.uploads import SERVER_SETTINGS, UNREADABLE_BODY, body_deadline, close_refused, expect_later, read_within

__all__ = ["AUTH", "FIELDS", "LIMITS", "RELAYED", "SERVER_SETTINGS", "UNREADABLE_BODY", "AuthConfigError",
           "Authenticator", "Limits", "Router", "authenticate", "body_deadline", "claim_for_call", "close_refused",
           "enforce_limits", "expect_later", "is_loopback", "may_create_eval", "operator_caller", "own_rollout",
           "read_within", "resolve_auth", "reward_giver", "scope_rollouts", "token_rollout", "use_guarded_handler",
           "valid_host"]
