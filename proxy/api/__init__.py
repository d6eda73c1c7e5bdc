"""The API as the routes declare it: each route an `Endpoint` (endpoints.py: its method and path, its request and
answer models, where it is mounted), the OpenAPI document made from those declarations and the running server's
settings (openapi.py), the hint a 404 gives for a path that is almost a route (route_hints.py), and what routes
read from a request besides its JSON body, written once (inputs.py: bounded bodies, path ids, query parameters).

This is the wing's one door: the rest of the proxy imports only what this module exports, never a module inside."""
from __future__ import annotations

from proxy.api.endpoints import API_ERRORS, PREFIXES, RECORDED, Answer, Endpoint, mounted, register
from proxy.api.inputs import query_flag, query_number, query_text, read_bounded, rollout_in_path
from proxy.api.openapi import openapi_document
from proxy.api.route_hints import hint

__all__ = ["API_ERRORS", "PREFIXES", "RECORDED", "Answer", "Endpoint", "hint", "mounted", "openapi_document",
           "query_flag", "query_number", "query_text", "read_bounded", "register", "rollout_in_path"]
