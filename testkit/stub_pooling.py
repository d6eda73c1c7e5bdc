"""The stand-in engine's read-only routes beside generation, answered in the shapes vLLM 0.32 gives: tokenize and
detokenize, pooling (embeddings, `/pooling`, classify), score and rerank, and liveness (`/ping`, `/version`).
Deterministic, like the rest of the stub: a text's vector and scores come from a hash of it. A body these routes
cannot read is a 400 in OpenAI's error shape, as vLLM answers it (never a 500: the proxy relays what it gets)."""
from __future__ import annotations

import hashlib
import json
from typing import Any

from aiohttp import web

from core.errors import RlproxyError

VERSION = "0.32.0+stub"
DIMENSIONS = 8
LABELS = ("negative", "positive")


class BadBody(RlproxyError, ValueError):
    """The request body is not one this route reads."""


def _vector(text: str) -> list[float]:
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
    return [round(b / 255 * 2 - 1, 4) for b in digest[:DIMENSIONS]]


def _score(first: str, second: str) -> float:
    return round(hashlib.sha256(f"{first}\x00{second}".encode("utf-8", "surrogatepass")).digest()[0] / 255, 4)


def _ids(values: list) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def _texts(value: Any, name: str) -> list[str]:
    """A text, a list of texts, token ids or lists of token ids (as OpenAI's `input`), each as one text."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            return value
        if _ids(value):
            return [" ".join(map(str, value))]
        if all(isinstance(v, list) and _ids(v) for v in value):
            return [" ".join(map(str, v)) for v in value]
    raise BadBody(f"{name} must be a string, a list of strings or token ids")


def _field(body: dict, *names: str) -> Any:
    for name in names:
        if name in body:
            return body[name]
    raise BadBody(f"{names[0]} is required")


def _usage(texts: list[str]) -> dict[str, int]:
    tokens = sum(len(t.split()) for t in texts)
    return {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}


def _listing(body: dict, kind: str, data: list[dict], texts: list[str]) -> dict[str, Any]:
    return {"id": f"{kind}-stub", "object": "list", "created": 1_700_000_000, "model": body.get("model"),
            "data": data, "usage": _usage(texts)}


SPELLED: dict[int, str] = {}  # ids the stub spells as words (its vocabulary); others read as <id>


def detokenize(body: dict) -> dict:
    tokens = _field(body, "tokens")
    if not isinstance(tokens, list) or not _ids(tokens):
        raise BadBody("tokens must be a list of token ids")
    return {"prompt": " ".join(SPELLED.get(t, f"<{t}>") for t in tokens)}


def embeddings(body: dict) -> dict:
    texts = _texts(_field(body, "input"), "input")
    data = [{"index": i, "object": "embedding", "embedding": _vector(t)} for i, t in enumerate(texts)]
    return _listing(body, "embd", data, texts)


def embed_v2(body: dict) -> dict:
    """Cohere's embed API, as vLLM serves it at /v2/embed."""
    texts = _texts(_field(body, "texts", "inputs"), "texts")
    return {"id": "embd-stub", "embeddings": {"float": [_vector(t) for t in texts]}, "texts": texts,
            "meta": {"api_version": {"version": "2"},
                     "billed_units": {"input_tokens": _usage(texts)["total_tokens"]}}}


def pooling(body: dict) -> dict:
    texts = _texts(_field(body, "input", "messages"), "input")
    data = [{"index": i, "object": "pooling", "data": _vector(t)} for i, t in enumerate(texts)]
    return _listing(body, "pool", data, texts)


def classify(body: dict) -> dict:
    texts = _texts(_field(body, "input"), "input")
    data = []
    for i, text in enumerate(texts):
        positive = _score(text, "")
        data.append({"index": i, "label": LABELS[positive >= 0.5], "probs": [1 - positive, positive],
                     "num_classes": len(LABELS)})
    return _listing(body, "classify", data, texts)


def score(body: dict) -> dict:
    first = _texts(_field(body, "text_1", "queries"), "text_1")
    second = _texts(_field(body, "text_2", "documents", "items"), "text_2")
    if len(first) == 1:
        first = first * len(second)
    if len(first) != len(second):
        raise BadBody("text_1 and text_2 must be as many, or text_1 one")
    data = [{"index": i, "object": "score", "score": _score(a, b)}
            for i, (a, b) in enumerate(zip(first, second))]
    return _listing(body, "score", data, first + second)


def rerank(body: dict) -> dict:
    query = _field(body, "query")
    if not isinstance(query, str):
        raise BadBody("query must be a string")
    documents = _texts(_field(body, "documents"), "documents")
    top_n = body.get("top_n") or len(documents)
    if not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 1:
        raise BadBody("top_n must be a positive integer")
    ranked = sorted(((i, _score(query, d)) for i, d in enumerate(documents)), key=lambda x: -x[1])[:top_n]
    results = [{"index": i, "document": {"text": documents[i]}, "relevance_score": s} for i, s in ranked]
    return {"id": "rerank-stub", "model": body.get("model"),
            "usage": {"total_tokens": _usage(documents)["total_tokens"]}, "results": results}


def answering(build):
    """An aiohttp handler for `build(body) -> answer`: a JSON object in, JSON out, 400 for anything else."""
    async def handler(request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
            if not isinstance(body, dict):
                raise BadBody("the body must be a JSON object")
            answer = build(body)
        except (ValueError, RecursionError) as exc:  # json's own errors are ValueErrors too
            error = {"message": str(exc), "type": "BadRequestError", "param": None, "code": 400}
            return web.json_response({"error": error}, status=400)
        return web.json_response(answer)
    return handler


async def ping(request: web.Request) -> web.Response:
    return web.Response()


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": VERSION})


POOLING = {"/v1/embeddings": embeddings, "/v2/embed": embed_v2, "/pooling": pooling, "/classify": classify,
           "/score": score, "/v1/score": score, "/rerank": rerank, "/v1/rerank": rerank, "/v2/rerank": rerank}


def add_routes(app: web.Application, tokenize, pooling_routes: bool = True) -> None:
    """These routes on the stub's app; `tokenize(body) -> answer` is the stub's own (it renders chat). Without
    `pooling_routes` the stub is like vLLM serving a generative model, which has no pooling routes (404)."""
    routes = {"/tokenize": tokenize, "/detokenize": detokenize, **(POOLING if pooling_routes else {})}
    for path, build in routes.items():
        app.router.add_post(path, answering(build))
    app.router.add_get("/ping", ping)
    app.router.add_post("/ping", ping)
    app.router.add_get("/version", version)
