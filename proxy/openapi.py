"""The OpenAPI 3.1 document of the proxy's own routes (`GET /openapi.json`).

Request bodies come from the pydantic models in `proxy/schemas.py`; what the running server enforces on top
(max_tokens / n limits, whether a key is needed) is written in from its settings, so the document describes
this server as it runs. Bodies the engine answers (completions, the model list) are described loosely: they
are the engine's own, passed through.
"""
from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

from proxy.dialects.messages import CountTokensRequest, MessagesRequest
from proxy.dialects.responses import ResponsesRequest
from proxy.routes.openai import PREFIXES
from proxy.schemas import ChatCompletionRequest, CompletionRequest, RewardPost, RolloutCreate
from rlproxy.settings import ProxySettings

REF = "#/components/schemas/{model}"
ID_PATTERN = r"^[A-Za-z0-9._:@\-]+$"  # proxy/context.py


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _model_schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema(ref_template=REF)


def _nullable(kind: str | list[str]) -> dict[str, Any]:
    kinds = [kind] if isinstance(kind, str) else list(kind)
    return {"type": kinds + ["null"]}


_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "param", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": _nullable("string"), "code": _nullable(["string", "integer"])},
    }},
}

_CALL = {
    "type": "object",
    "required": ["call_id", "seq", "agent", "model", "policy", "status", "prompt_token_ids",
                 "completion_token_ids", "completion_logprobs", "latency_ms", "request", "response"],
    "properties": {
        "call_id": {"type": "string"}, "seq": _nullable("integer"), "agent": _nullable("string"),
        "model": _nullable("string"), "policy": _nullable("integer"), "status": {"type": "string"},
        "prompt_token_ids": {"type": ["array", "null"], "items": {"type": "integer"}},
        "completion_token_ids": {"type": ["array", "null"], "items": {"type": "integer"}},
        "completion_logprobs": {"type": ["array", "null"], "items": {"type": "number"}},
        "latency_ms": _nullable("number"), "request": _nullable("object"), "response": _nullable("object"),
    },
}

_SCHEMAS: dict[str, Any] = {
    "Error": _ERROR,
    "RolloutCreated": {"type": "object", "required": ["rollout_id", "base_url"],
                       "properties": {"rollout_id": {"type": "string"}, "base_url": {"type": "string"}}},
    "RewardResult": {"type": "object", "required": ["rollout_id", "reward"],
                     "properties": {"rollout_id": {"type": "string"}, "reward": {"type": "number"},
                                    "call_id": {"type": "string"}}},
    "Call": _CALL,
    "Rollout": {
        "type": "object",
        "required": ["rollout_id", "task_id", "status", "reward", "calls", "rewards"],
        "properties": {
            "rollout_id": {"type": "string"}, "task_id": _nullable("string"),
            "status": {"type": "string", "enum": ["open", "finished"]}, "reward": _nullable("number"),
            "eval": {"type": "boolean"}, "policy": _nullable("integer"),
            "calls": {"type": "array", "items": _ref("Call")},
            "rewards": {"type": "array", "items": {
                "type": "object", "required": ["call_id", "kind", "value"],
                "properties": {"call_id": _nullable("string"), "kind": {"type": "string"},
                               "value": {"type": "number"}, "reason": _nullable("string")}}},
        },
    },
    "Policy": {"type": "object", "required": ["version", "status", "evaluation_traffic"],
               "properties": {"version": {"type": "integer"}, "name": _nullable("string"),
                              "status": {"enum": ["candidate", "active", "retired", "failed", "canary"]},
                              "metrics": _nullable("object"),
                              "evaluation_traffic": _ref("EvaluationTraffic")}},
    "EvaluationTraffic": {
        "type": "object", "required": ["n", "mean", "ci95", "interval"],
        "description": "Final rewards of the finished evaluation rollouts this version served. ci95: Wilson's "
                       "interval when every reward is 0 or 1, else Student's t interval on the mean (null for "
                       "a single non-binary reward).",
        "properties": {"n": {"type": "integer", "minimum": 0}, "mean": _nullable("number"),
                       "ci95": {"type": ["array", "null"], "items": {"type": "number"}, "minItems": 2,
                                "maxItems": 2},
                       "interval": {"enum": ["wilson", "t", None]}}},
    "PolicyList": {"type": "object", "required": ["data", "active"],
                   "properties": {"data": {"type": "array", "items": _ref("Policy")},
                                  "active": {"type": "integer"}}},
    "Activated": {"type": "object", "required": ["version", "status"],
                  "properties": {"version": {"type": "integer"}, "status": {"const": "active"}}},
    "Ready": {"type": "object", "required": ["status", "database", "engines"],
              "properties": {"status": {"type": "string", "enum": ["ready", "unavailable"]},
                             "database": {"type": "boolean"},
                             "engines": {"type": "object", "additionalProperties": {"type": "boolean"}}}},
    "EngineObject": {"type": "object", "description": "The engine's own response, passed through."},
    "Response": {"type": "object", "required": ["id", "object", "status", "output", "model"],
                 "description": "An OpenAI Response (id `resp_<call id>`).",
                 "properties": {"id": {"type": "string"}, "object": {"const": "response"},
                                "status": {"type": "string"}, "output": {"type": "array"},
                                "model": {"type": "string"}}},
    "Message": {"type": "object", "required": ["id", "type", "role", "content", "stop_reason", "usage"],
                "description": "An Anthropic Message (id `msg_<call id>`).",
                "properties": {"id": {"type": "string"}, "type": {"const": "message"}, "role": {"const": "assistant"},
                               "content": {"type": "array"}, "stop_reason": _nullable("string"),
                               "usage": {"type": "object"}}},
    "TokenCount": {"type": "object", "required": ["input_tokens"], "properties": {"input_tokens": {"type": "integer"}}},
    "AnthropicError": {"type": "object", "required": ["type", "error"], "properties": {
        "type": {"const": "error"},
        "error": {"type": "object", "required": ["type", "message"],
                  "properties": {"type": {"type": "string"}, "message": {"type": "string"}}}}},
}

_ERRORS = {
    400: "Malformed or invalid request (OpenAI routes), or over a configured limit.",
    401: "No key, or an unknown or revoked one (when auth is on).",
    403: "The route needs an admin key.",
    404: "Unknown rollout, call, policy or route; another project's rollout looks the same.",
    409: "A different final reward for a rollout that already has one.",
    413: "The request body is larger than the proxy accepts.",
    422: "Malformed body, or a reward that is not a finite number.",
    429: "Over the key's rate limit; Retry-After says when to try again.",
    502: "No engine reachable, or the engine refused to load the adapter.",
    503: "The database did not answer in time.",
    504: "The engine did not answer in time.",
}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def _responses(ok: dict[str, Any], *errors: int, engine: bool = False, shape: str = "Error") -> dict[str, Any]:
    out = dict(ok)
    for status in errors:
        response: dict[str, Any] = {"description": _ERRORS[status], **_json(_ref(shape))}
        if status == 429:
            response["headers"] = {"Retry-After": {"required": True,
                                                   "schema": {"type": "string", "pattern": "^[0-9]+$"}}}
        out[str(status)] = response
    if engine:
        out["4XX"] = {"description": "The engine's own error, passed through.", **_json(_ref(shape))}
    return out


class _Builder:
    def __init__(self, settings: ProxySettings, auth_enabled: bool, served_model: str | None) -> None:
        self.settings = settings
        self.auth_enabled = auth_enabled
        self.served_model = served_model or "model"
        self.paths: dict[str, dict[str, Any]] = {}

    def operation(self, path: str, method: str, summary: str, responses: dict[str, Any], *,
                  body: dict[str, Any] | None = None, body_required: bool = True,
                  parameters: list[dict[str, Any]] | None = None, public: bool = False,
                  admin: bool = False, shape: str = "Error") -> None:
        auth_errors = () if public or not self.auth_enabled else ((401, 403) if admin else (401,))
        operation: dict[str, Any] = {"summary": summary, "operationId": _operation_id(method, path),
                                     "responses": {**responses, **_responses({}, *auth_errors, shape=shape)}}
        if parameters:
            operation["parameters"] = parameters
        if body is not None:
            operation["requestBody"] = {"required": body_required, **body}
            operation["responses"].update(_responses({}, 413, shape=shape))
        if not public and self.auth_enabled:
            operation["security"] = [{"bearerAuth": []}]
            operation["responses"].update(_responses({}, 429, shape=shape))
        elif not public and self.settings.auth.rate_limit:
            operation["responses"].update(_responses({}, 429, shape=shape))
        self.paths.setdefault(path, {})[method] = operation

    def openai_body(self, model: type[BaseModel], example: dict[str, Any]) -> dict[str, Any]:
        schema = copy.deepcopy(_model_schema(model))
        limits = self.settings.auth
        if limits.max_tokens:
            for name in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
                if model in (ChatCompletionRequest, CompletionRequest):
                    schema["properties"][name] = {"type": ["integer", "null"], "maximum": limits.max_tokens}
                elif name in schema["properties"]:
                    schema["properties"][name] = {"type": ["integer", "null"], "minimum": 1,
                                                  "maximum": limits.max_tokens}
        if limits.max_n:
            schema["properties"]["n"] = {"anyOf": [{"type": "integer", "minimum": 1, "maximum": limits.max_n},
                                                   {"type": "null"}]}
        return {"content": {"application/json": {"schema": schema, "example": example}}}


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
ROLLOUT_ID, AGENT = _path_param("rollout_id", _ID), _path_param("agent", _ID)
CONTEXT_HEADERS = [_header("X-Rollout-Id", 128, ID_PATTERN), _header("X-Agent-Name", 128, ID_PATTERN),
                   _header("X-Task-Id", 256, r"^[^\x00-\x1f\x7f]+$"),
                   {"name": "X-Rlproxy-Eval", "in": "header", "required": False,
                    "description": "1: the call's rollout is evaluation traffic (never trained on); any case of "
                                   "1/0, true/false, yes/no, on/off.",
                    "schema": {"type": "string", "enum": ["1", "0", "true", "false", "yes", "no", "on", "off"]}}]


def openapi_document(settings: ProxySettings, *, auth_enabled: bool,
                     served_model: str | None) -> dict[str, Any]:
    b = _Builder(settings, auth_enabled, served_model)
    completion_ok = {"200": {
        "description": "The engine's answer, as the engine sent it (SSE when `stream` is true).",
        "headers": {"X-Rlproxy-Call-Id": {"required": True, "schema": {"type": "string"}}},
        "content": {"application/json": {"schema": _ref("EngineObject")},
                    "text/event-stream": {}},  # chunks as the engine sent them
    }}
    openai_errors = (400, 404, 502, 503, 504)
    chat = b.openai_body(ChatCompletionRequest, {"model": b.served_model,
                                                 "messages": [{"role": "user", "content": "What is 6*7?"}]})
    completion = b.openai_body(CompletionRequest, {"model": b.served_model, "prompt": "6*7 ="})
    responses_body = b.openai_body(ResponsesRequest, {"model": b.served_model, "input": "What is 6*7?"})
    user = [{"role": "user", "content": "What is 6*7?"}]
    messages_body = b.openai_body(MessagesRequest, {"model": b.served_model, "max_tokens": 64, "messages": user})
    count_body = b.openai_body(CountTokensRequest, {"model": b.served_model, "messages": user})

    def dialect_ok(schema: str) -> dict[str, Any]:
        return {"200": {"description": "The answer (events when `stream` is true).",
                        "headers": {"X-Rlproxy-Call-Id": {"required": True, "schema": {"type": "string"}}},
                        "content": {"application/json": {"schema": _ref(schema)}, "text/event-stream": {}}}}
    for prefix in PREFIXES:
        params = ([ROLLOUT_ID] if "{rollout_id}" in prefix else []) + ([AGENT] if "{agent}" in prefix else [])
        where = " (recorded into the rollout in the path)" if params else ""
        b.operation(prefix + "/v1/chat/completions", "post", "OpenAI chat completions" + where,
                    _responses(completion_ok, *openai_errors, engine=True), body=chat,
                    parameters=params + CONTEXT_HEADERS)
        b.operation(prefix + "/v1/completions", "post", "OpenAI completions" + where,
                    _responses(completion_ok, *openai_errors, engine=True), body=completion,
                    parameters=params + CONTEXT_HEADERS)
        b.operation(prefix + "/v1/models", "get", "The engine's model list",
                    _responses({"200": {"description": "The engine's model list.",
                                        **_json(_ref("EngineObject"))}}, 400, 404, 502, engine=True),
                    parameters=params + CONTEXT_HEADERS)
        b.operation(prefix + "/v1/responses", "post", "OpenAI Responses API" + where,
                    _responses(dialect_ok("Response"), *openai_errors, engine=True), body=responses_body,
                    parameters=params + CONTEXT_HEADERS)
        b.operation(prefix + "/v1/responses/{response_id}", "get", "A stored Response (kept by the proxy)",
                    _responses({"200": {"description": "The Response.", **_json(_ref("Response"))}}, 400, 404, 503),
                    parameters=params + [_path_param("response_id", {"type": "string"})] + CONTEXT_HEADERS)
        b.operation(prefix + "/v1/messages", "post", "Anthropic Messages API" + where,
                    _responses(dialect_ok("Message"), *openai_errors, engine=True, shape="AnthropicError"),
                    body=messages_body, parameters=params + CONTEXT_HEADERS, shape="AnthropicError")
        b.operation(prefix + "/v1/messages/count_tokens", "post", "Anthropic token counting (the engine's count)",
                    _responses({"200": {"description": "Tokens.", **_json(_ref("TokenCount"))}}, *openai_errors,
                               engine=True, shape="AnthropicError"),
                    body=count_body, parameters=params + CONTEXT_HEADERS, shape="AnthropicError")

    b.operation("/rollouts", "post", "Start a rollout; its base_url records every call made through it",
                _responses({"201": {"description": "Created.", **_json(_ref("RolloutCreated"))}}, 422, 503),
                body=_json(_model_schema(RolloutCreate)), body_required=False)
    b.operation("/reward", "post", "Final reward (closes the rollout) or a reward for one call",
                _responses({"200": {"description": "Stored (or the same final reward again).",
                                    **_json(_ref("RewardResult"))}}, 404, 409, 422, 503),
                body=_json(_model_schema(RewardPost)))
    b.operation("/rollouts/{rollout_id}", "get", "A rollout with its calls (token ids, logprobs) and rewards",
                _responses({"200": {"description": "The rollout.", **_json(_ref("Rollout"))}}, 404, 503),
                parameters=[_path_param("rollout_id", {"type": "string"})])
    b.operation("/policies", "get", "Policy versions and which one serves",
                _responses({"200": {"description": "Versions.", **_json(_ref("PolicyList"))}}))
    b.operation("/policies/{version}/activate", "post", "Serve this version (rollback too); admin only",
                _responses({"200": {"description": "Now serving.", **_json(_ref("Activated"))}},
                           400, 404, 502),
                parameters=[_path_param("version", {"type": "string", "pattern": r"^v?[0-9]{1,9}$"})],
                admin=True)
    b.operation("/healthz", "get", "The process is up",
                {"200": {"description": "Up.", **_json({"type": "object", "required": ["status"]})}},
                public=True)
    b.operation("/readyz", "get", "The database and at least one engine answer",
                {"200": {"description": "Ready.", **_json(_ref("Ready"))},
                 "503": {"description": "Not ready.", **_json(_ref("Ready"))}}, public=True)
    b.operation("/metrics", "get", "Prometheus metrics; admin only when auth is on",
                {"200": {"description": "Prometheus text format.",
                         "content": {"text/plain": {"schema": {"type": "string"}}}}}, admin=True)
    b.operation("/openapi.json", "get", "This document",
                {"200": {"description": "OpenAPI 3.1.", **_json({"type": "object"})}}, public=True)

    components: dict[str, Any] = {"schemas": _SCHEMAS}
    if auth_enabled:
        components["securitySchemes"] = {"bearerAuth": {
            "type": "http", "scheme": "bearer", "description": "A project's key (`rlproxy keys create`)."}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "rlproxy", "version": "1",
                 "description": "An OpenAI-compatible proxy that records every call by rollout and takes "
                                "rewards. Errors everywhere: {\"error\": {message, type, param, code}}."},
        "paths": b.paths,
        "components": components,
    }
