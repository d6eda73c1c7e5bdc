"""`GET /openapi.json`: the OpenAPI document of this server's routes, as configured."""
from __future__ import annotations

from aiohttp import web

from proxy.auth import AUTH
from proxy.errors import json_response
from proxy.openapi import openapi_document
from proxy.state import state


async def openapi(request: web.Request) -> web.Response:
    app = state(request)
    return json_response(openapi_document(app.settings, auth_enabled=request.app[AUTH].enabled,
                                          served_model=app.router.served_model))


def add_routes(app: web.Application) -> None:
    app.router.add_get("/openapi.json", openapi)
