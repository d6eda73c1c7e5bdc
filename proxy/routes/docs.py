"""`GET /openapi.json`: the OpenAPI document of this server's routes, as configured."""
from __future__ import annotations

from aiohttp import web

from proxy.auth import AUTH
from proxy.bodies import OpenAPIDocument
from proxy.endpoints import Answer, Endpoint
from proxy.errors import json_response
from proxy.openapi import openapi_document
from proxy.state import state


DOCUMENTED = web.AppKey("rlproxy_documented_endpoints", list)  # set by proxy/app.py: what the document describes


async def openapi(request: web.Request) -> web.Response:
    app = state(request)
    return json_response(openapi_document(app.settings, request.app[DOCUMENTED],
                                          auth_enabled=request.app[AUTH].enabled,
                                          served_model=app.router.served_model))


ENDPOINTS = [
    Endpoint("get", "/openapi.json", openapi, "This document", {200: Answer("OpenAPI 3.1.", OpenAPIDocument)},
             access="public"),
]
