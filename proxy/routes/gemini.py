"""The Gemini API: `POST /v1beta/models/{model}:generateContent`, `:streamGenerateContent?alt=sse`, `:countTokens`
(the same under `/v1`, google-genai 3's default version) and `GET /v1beta/models`, under the rollout prefixes as
the other APIs (the google-genai SDK's and Gemini CLI's base URL is the rollout's URL without `/v1`: they add
`/v1beta/models/…` or `/v1/models/…` themselves; `GET /v1/models` stays the OpenAI model list). Errors on these
paths are in Google's shape (the error middleware knows them: `in_gemini_api`).

The key is read as the other routes read it, and also from `x-goog-api-key`, the header Google's clients send
(proxy/edge/auth.py). A key in the URL (`?key=`), which Google's API also takes, is refused here: a URL is what
gateways, proxies and shells write into their logs and history, so the key would leak there."""
from __future__ import annotations

import re

import orjson
from aiohttp import web

from core.gemini_chat import chat_messages, chat_tools
from proxy.api import API_ERRORS, PREFIXES, RECORDED, Answer, Endpoint, mounted
from proxy.bodies import GeminiModels, GeminiTokenCount, GenerateContentResponse
from proxy.context import call_context
from proxy.dialects.fields import GEMINI_COUNT_TOKENS, refuse_unknown_google
from proxy.dialects.gemini import GEMINI, CountTokensRequest, GenerateContentRequest
from proxy.errors import InvalidRequest, UpstreamUnavailable, Unauthorized, json_response
from proxy.schemas import parse_json_object
from proxy.state import state

API = "/v1beta/models"
_METHOD = re.compile(r"/v1(?:beta)?/models/[^:]*:")
KEY_IN_URL = ("an API key in the URL (?key=) is refused: URLs are written into logs and shell history; send it "
              "as the x-goog-api-key header, as google-genai and Gemini CLI do")


def in_gemini_api(path: str) -> bool:
    """A path of the Gemini API (served or not), whose errors a Gemini client reads in Google's shape."""
    return f"{API}/" in path or path.endswith(API) or _METHOD.search(path) is not None


def _model(request: web.Request) -> str:
    if "key" in request.query:
        raise Unauthorized(KEY_IN_URL, code="key_in_url")
    return request.match_info["model"]


async def generate_content(request: web.Request) -> web.StreamResponse:
    return await state(request).serving[GEMINI.route].handle(request, path_model=_model(request))


async def stream_generate_content(request: web.Request) -> web.StreamResponse:
    model = _model(request)
    if request.query.get("alt") != "sse":
        raise InvalidRequest("streamGenerateContent is served as server-sent events: add ?alt=sse (google-genai "
                             "and Gemini CLI send it)", param="alt", code="alt_sse_required")
    return await state(request).serving["gemini_stream"].handle(request, path_model=model)


async def count_tokens(request: web.Request) -> web.Response:
    """The prompt's length as the engine tokenizes the chat rendering the same generateContent call would serve
    (`/tokenize`): `contents`, or a whole `generateContentRequest`."""
    model = _model(request)
    body = parse_json_object(await request.read())
    app = state(request)
    app.boundary.check_common(body)
    refuse_unknown_google(body, GEMINI_COUNT_TOKENS | app.boundary.allowed)
    inner = body.get("generateContentRequest")
    if inner is not None and not isinstance(inner, dict):
        raise InvalidRequest("generateContentRequest: expected an object", param="generateContentRequest")
    if inner is None and "contents" not in body:
        raise InvalidRequest("contents: required", param="contents")
    request_body = {**(inner or {"contents": body["contents"]}), "model": model}
    GEMINI.validate(request_body, app.boundary.allowed)
    context = call_context(request)
    tools = chat_tools(request_body)
    status, raw = await app.serving[GEMINI.route].count_tokens(model, chat_messages(request_body), context,
                                                               **({"tools": tools} if tools else {}))
    if status != 200:
        return web.Response(body=GEMINI.engine_error(status, raw), status=status, content_type="application/json")
    return GeminiTokenCount(totalTokens=int(orjson.loads(raw)["count"])).reply()


async def list_models(request: web.Request) -> web.Response:
    """The engine's models in Gemini's shape (a project's key: the ones it may call)."""
    if "key" in request.query:
        raise Unauthorized(KEY_IN_URL, code="key_in_url")
    context = call_context(request)
    app = state(request)
    status, raw, _ = await app.upstreams.model_list(request.match_info.get("rollout_id"))
    if status != 200:
        return web.Response(body=GEMINI.engine_error(status, raw), status=status, content_type="application/json")
    try:
        listing = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise UpstreamUnavailable("engine returned an invalid model list") from None
    if not isinstance(listing, dict):
        raise UpstreamUnavailable("engine returned an invalid model list")
    listing = await app.access.visible(listing, context.project)
    names = [m["id"] for m in listing.get("data") or () if isinstance(m, dict) and isinstance(m.get("id"), str)]
    return json_response({"models": [
        {"name": f"models/{name}", "displayName": name,
         "supportedGenerationMethods": ["generateContent", "streamGenerateContent", "countTokens"]}
        for name in names]})


MODEL = {"model": {"type": "string", "minLength": 1, "pattern": r"^[^:]+$"}}
NAME = {"model": "[^:]+"}  # a served model's name may hold a slash (Qwen/Qwen3-8B), never a colon
ALT = {"alt": {"type": "string", "enum": ["sse"]}}
USER = [{"role": "user", "parts": [{"text": "What is 6*7?"}]}]
ANSWER = Answer("The GenerateContentResponse (events with `?alt=sse` on streamGenerateContent).",
                GenerateContentResponse, stream=True, call_id=True)


def _methods(version: str) -> list[Endpoint]:
    api = f"{version}/models"
    return [
        Endpoint("post", f"{api}/{{model}}:generateContent", generate_content, "Gemini API generateContent",
                 {200: ANSWER}, API_ERRORS, body=GenerateContentRequest, engine_errors=True, google=True,
                 context_headers=True, path_params=MODEL, patterns=NAME, example=lambda model: {"contents": USER}),
        Endpoint("post", f"{api}/{{model}}:streamGenerateContent", stream_generate_content,
                 "Gemini API streamGenerateContent (server-sent events: ?alt=sse)", {200: ANSWER}, API_ERRORS,
                 body=GenerateContentRequest, engine_errors=True, google=True, context_headers=True,
                 path_params=MODEL, patterns=NAME, query_params=ALT, example=lambda model: {"contents": USER}),
        Endpoint("post", f"{api}/{{model}}:countTokens", count_tokens, "Gemini API countTokens (the engine's count)",
                 {200: Answer("Tokens.", GeminiTokenCount)}, API_ERRORS, engine_errors=True, google=True,
                 context_headers=True, path_params=MODEL, patterns=NAME, body=CountTokensRequest,
                 example=lambda model: {"contents": USER}),
    ]


ENDPOINTS = mounted([
    *_methods("/v1beta"), *_methods("/v1"),
    Endpoint("get", API, list_models, "The engine's models in the Gemini API's shape",
             {200: Answer("The models.", GeminiModels)}, (400, 404, 502), engine_errors=True, google=True,
             context_headers=True),
], PREFIXES, RECORDED)
