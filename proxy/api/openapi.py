"""The OpenAPI 3.1 document of the proxy's routes (`GET /openapi.json`), generated from the route table (each
module of proxy/routes/ lists its Endpoints, the relayed engine routes included) and the models: request bodies
from proxy/schemas.py and the dialect modules, response bodies from proxy/bodies.py, which the handlers answer
with. What the running server enforces on top (max_tokens / n limits, whether a key is needed, how deeply a JSON
body may nest) is written in from its settings and proxy/strict_json.py, so the document describes this server as it
runs. Bodies the engine answers (completions, the model list, the relayed routes) are described loosely: they are
the engine's own, passed through.
"""
from __future__ import annotations

import copy
import re
from typing import Any

from pydantic import BaseModel

from core.settings import ProxySettings
from proxy.bodies import AnthropicError, Error, GoogleError
from proxy.api.endpoints import Answer, Endpoint
from proxy.strict_json import MAX_JSON_DEPTH

REF = "#/components/schemas/{model}"
PROTOBUF = "application/x-protobuf"
ID_PATTERN = r"^[A-Za-z0-9._:@\-]+$"  # proxy/context.py


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _model_schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema(ref_template=REF)


def _component_schemas(models: list[type[BaseModel]]) -> dict[str, Any]:
    """The JSON schema of every body the routes answer with, generated from its model, nested models included."""
    schemas: dict[str, Any] = {}
    for model in dict.fromkeys(models):
        schema = _model_schema(model)
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return schemas


_ERRORS = {
    400: "Malformed or invalid request (OpenAI routes), a JSON body nested too deeply (`json_too_deep`), or over "
         "a configured limit.",
    401: "No key, or an unknown or revoked one (when auth is on).",
    403: "The route needs an admin key.",
    404: "Unknown rollout, call, policy, model or route; another project's rollout or adapter looks the same.",
    408: "The body did not arrive within --body-timeout of its request's head (`request_timeout`); the connection "
         "is closed.",
    409: "A different final reward for a rollout that already has one.",
    413: "The request body is larger than the proxy accepts, or a compressed one inflates past its bounds "
         "(`inflated_body_too_large`, `inflation_ratio_too_high`).",
    415: "A body in a content type, or a Content-Encoding, the route does not read (gzip and deflate are read).",
    422: "Malformed body, a JSON body nested too deeply (`json_too_deep`), or a reward that is not a finite number.",
    429: "Over the key's rate limit; Retry-After says when to try again.",
    502: "No engine reachable, or the engine refused to load the adapter.",
    503: "The database did not answer in time.",
    504: "The engine did not answer in time.",
}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def _errors(statuses: tuple[int, ...], shape: str) -> dict[str, Any]:
    out = {}
    for status in statuses:
        response: dict[str, Any] = {"description": _ERRORS[status], **_json(_ref(shape))}
        if status == 429:
            response["headers"] = {"Retry-After": {"required": True,
                                                   "schema": {"type": "string", "pattern": "^[0-9]+$"}}}
        out[str(status)] = response
    return out


def _answer(answer: Answer) -> dict[str, Any]:
    out: dict[str, Any] = {"description": answer.description}
    if answer.call_id:
        out["headers"] = {"X-Rlproxy-Call-Id": {"required": True, "schema": {"type": "string"}}}
    if answer.text:
        out["content"] = {"text/plain": {"schema": {"type": "string"}}}
    elif answer.media:
        out["content"] = {media: {"schema": {"type": "string"}} for media in answer.media}
    elif answer.model is not None:
        out["content"] = {"application/json": {"schema": _ref(answer.model.__name__)}}
        if answer.stream:
            out["content"]["text/event-stream"] = {}  # events as the engine (or the dialect) sends them
    return out


def _depth_note(endpoint: Endpoint) -> str:
    # Routes that answer a malformed body with 422 (/rollouts, /reward) list 422 and not 400 among their errors.
    status = 400 if 400 in endpoint.errors else 422
    return (f"A JSON body that nests arrays and objects more than {MAX_JSON_DEPTH} levels deep (the body itself "
            f"is level 1) is refused: {status}, error code `json_too_deep`.")


def _operation_id(method: str, path: str) -> str:
    words = [p.strip("{}") for p in path.strip("/").replace(".", "_").split("/")]
    return method + "_" + "_".join(words)


def _path_param(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": schema}


def _header(name: str, limit: int, pattern: str | None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "maxLength": limit}
    if pattern:
        schema["pattern"] = pattern
    return {"name": name, "in": "header", "required": False, "schema": schema}


_ID = {"type": "string", "minLength": 1, "maxLength": 128, "pattern": ID_PATTERN}
PATH_SCHEMAS = {"rollout_id": _ID, "agent": _ID}  # what proxy/context.py accepts; other names: any string
CONTEXT_HEADERS = [_header("X-Rollout-Id", 128, ID_PATTERN), _header("X-Agent-Name", 128, ID_PATTERN),
                   _header("X-Task-Id", 256, r"^[^\x00-\x1f\x7f]+$"),
                   {"name": "X-Rlproxy-Eval", "in": "header", "required": False,
                    "description": "1: the call's rollout is evaluation traffic (never trained on); any case of "
                                   "1/0, true/false, yes/no, on/off.",
                    "schema": {"type": "string", "enum": ["1", "0", "true", "false", "yes", "no", "on", "off"]}}]


class _Builder:
    def __init__(self, settings: ProxySettings, auth_enabled: bool, served_model: str | None) -> None:
        self.settings = settings
        self.auth_enabled = auth_enabled
        self.served_model = served_model or "model"
        self.paths: dict[str, dict[str, Any]] = {}

    def add(self, endpoint: Endpoint) -> None:
        shape = "AnthropicError" if endpoint.anthropic else "GoogleError" if endpoint.google else "Error"
        public, admin = endpoint.access == "public", endpoint.access == "admin"
        responses = {str(status): _answer(answer) for status, answer in endpoint.answers.items()}
        responses.update(_errors(endpoint.errors, shape))
        if endpoint.engine_errors:
            responses["4XX"] = {"description": "The engine's own error, passed through.", **_json(_ref(shape))}
        auth_errors = () if public or not self.auth_enabled else ((401, 403) if admin else (401,))
        responses.update(_errors(auth_errors, shape))
        operation: dict[str, Any] = {"summary": endpoint.summary,
                                     "operationId": _operation_id(endpoint.method, endpoint.path),
                                     "responses": responses}
        names = re.findall(r"{(\w+)}", endpoint.path)
        parameters = [_path_param(name, endpoint.path_params.get(name, PATH_SCHEMAS.get(name, {"type": "string"})))
                      for name in names]
        parameters += [{"name": name, "in": "query", "required": False, "schema": schema}
                       for name, schema in endpoint.query_params.items()]
        if endpoint.context_headers:
            parameters += CONTEXT_HEADERS
        if parameters:
            operation["parameters"] = parameters
        if endpoint.body is not None:
            body = (self.api_body(endpoint.body, endpoint.example(self.served_model)) if endpoint.example
                    else _json(_model_schema(endpoint.body)))
            operation["requestBody"] = {"required": endpoint.body_required, "description": _depth_note(endpoint),
                                        **body}
            responses.update(_errors((408, 413, 415), shape))
        if endpoint.protobuf:  # the same message, binary: in the request and in the answer
            operation["requestBody"]["content"][PROTOBUF] = {"schema": {"type": "string", "format": "binary"}}
            for status in endpoint.answers:
                responses[str(status)]["content"][PROTOBUF] = {"schema": {"type": "string", "format": "binary"}}
        if not public and (self.auth_enabled or self.settings.auth.rate_limit):
            responses.update(_errors((429,), shape))
        if not public and self.auth_enabled:
            operation["security"] = [{"bearerAuth": []}]
        self.paths.setdefault(endpoint.path, {})[endpoint.method] = operation

    def api_body(self, model: type[BaseModel], example: dict[str, Any]) -> dict[str, Any]:
        """An OpenAI/Anthropic request body, with this server's limits written into its schema."""
        schema = copy.deepcopy(_model_schema(model))
        for name in self.settings.allow_request_fields:  # the operator's (--allow-request-field)
            schema["properties"].setdefault(name, {})
        limits = self.settings.auth
        if limits.max_tokens:
            for name in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
                if name not in schema["properties"]:
                    continue
                if model.__name__ in ("ChatCompletionRequest", "CompletionRequest"):
                    schema["properties"][name] = {"type": ["integer", "null"], "maximum": limits.max_tokens}
                else:
                    schema["properties"][name] = {"type": ["integer", "null"], "minimum": 1,
                                                  "maximum": limits.max_tokens}
        if limits.max_n and "n" in schema["properties"]:
            schema["properties"]["n"] = {"anyOf": [{"type": "integer", "minimum": 1, "maximum": limits.max_n},
                                                   {"type": "null"}]}
        return {"content": {"application/json": {"schema": schema, "example": example}}}


def openapi_document(settings: ProxySettings, endpoints: list[Endpoint], *, auth_enabled: bool,
                     served_model: str | None) -> dict[str, Any]:
    """The document for `endpoints` (the app's: proxy.routes.documented_endpoints())."""
    builder = _Builder(settings, auth_enabled, served_model)
    for endpoint in endpoints:
        builder.add(endpoint)
    models = [Error, AnthropicError, GoogleError] + [answer.model for endpoint in endpoints
                                        for answer in endpoint.answers.values() if answer.model is not None]
    components: dict[str, Any] = {"schemas": _component_schemas(models)}
    if auth_enabled:
        components["securitySchemes"] = {"bearerAuth": {
            "type": "http", "scheme": "bearer", "description": "A project's key (`rlproxy keys create`)."}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "rlproxy", "version": "1",
                 "description": "An OpenAI-compatible proxy that records every call by rollout and takes "
                                "rewards. Errors everywhere: {\"error\": {message, type, param, code}}. The "
                                "engine's read-only routes (tokenize, pooling, score, rerank, liveness) are relayed "
                                "unrecorded; they are described here without a prefix, and are served the same "
                                "under /rollouts/{rollout_id} and /rollouts/{rollout_id}/agents/{agent}."},
        "paths": builder.paths,
        "components": components,
    }
