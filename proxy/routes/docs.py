"""`GET /openapi.json`: the OpenAPI document of this server's routes, as configured."""
from __future__ import annotations

import orjson
from aiohttp import web

from proxy.edge import AUTH
from proxy.bodies import OpenAPIDocument
from proxy.api import Answer, Endpoint, openapi_document
from proxy.state import state


DOCUMENTED = web.AppKey("rlproxy_documented_endpoints", list)  # set by proxy/app.py: what the document describes
# The document, built once per served model name (the rest is fixed at start-up): building it took 40-120 ms of
# the event loop, on a route anyone may call without a key.
BUILT = web.AppKey("rlproxy_openapi_built", dict)


async def openapi(request: web.Request) -> web.Response:
    app = state(request)
    built = request.app[BUILT]
    model = app.router.served_model
    if model not in built:
        built.clear()  # one entry: the served model changes rarely, and never back and forth without bound
        built[model] = orjson.dumps(openapi_document(app.settings, request.app[DOCUMENTED],
                                                     auth_enabled=request.app[AUTH].enabled, served_model=model))
    return web.Response(body=built[model], content_type="application/json")


ENDPOINTS = [
    Endpoint("get", "/openapi.json", openapi, "This document", {200: Answer("OpenAPI 3.1.", OpenAPIDocument)},
             access="public"),
]
