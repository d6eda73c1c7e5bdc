"""The engine routes an agent may reach through the proxy without being recorded: an allow-list.

Only routes that neither change the engine nor generate text are relayed: tokenizing, pooling (embeddings,
scores, rerank, classification) and liveness. Everything that generates goes through the proxy's own recorded
routes (chat, completions, Responses, Messages), where limits apply and the call is kept for training; every
other engine route is unknown to the proxy (404), including those vLLM 0.32 registers for administration
(`/v1/load_lora_adapter`, `POST /adapters`, `/sleep`, `/collective_rpc`, weight updates, …) and for
generation outside the recorded routes (`/invocations`, `/v1/chat/completions/batch`, `/v1/responses/{id}/cancel`,
`/inference/v1/generate`, `/v1/audio/*`: transcription writes text no one records or bounds by `max_tokens`).

Each path is registered with the proxy's router as it is written here, so a request matches it exactly (case,
slashes) as vLLM's router would; the engine is sent the path from this table, never one derived from the
request, so no spelling of a path (dot segments, encoded slashes) can reach another route. None of these routes
reads a query parameter in vLLM 0.32, so none is relayed: a request carrying a query string is refused (400
naming the parameter, proxy/routes/passthrough.py), as a body field outside `FIELDS` is. Pure data: the routes
module relays, the auth and limits middlewares treat these like the other OpenAI routes.

`FIELDS` are the top-level body fields each relayed route takes: vLLM 0.32's request fields for that route less
the ones refused everywhere (proxy/dialects/fields.py `STEERING`: `chat_template`, `priority`, `request_id`,
`mm_processor_kwargs`, `media_io_kwargs`); any other is 400 naming it (tests/test_request_fields.py checks the
lists against the installed vLLM).
"""
from __future__ import annotations

POST = ("POST",)
GET = ("GET",)

RELAYED: dict[str, tuple[str, ...]] = {
    "/tokenize": POST,
    "/detokenize": POST,
    "/v1/embeddings": POST,
    "/v2/embed": POST,
    "/pooling": POST,
    "/classify": POST,
    "/score": POST,
    "/v1/score": POST,
    "/rerank": POST,
    "/v1/rerank": POST,
    "/v2/rerank": POST,
    "/health": GET,
    "/ping": ("GET", "POST"),
    "/version": GET,
}

_MODEL = {"model"}
_TEMPLATE = {"messages", "add_special_tokens", "add_generation_prompt", "continue_final_message", "chat_template_kwargs"}
_POOLING = _MODEL | _TEMPLATE | {"input", "user", "truncate_prompt_tokens", "truncation_side", "padding",
                                 "use_activation", "cache_salt"}
_EMBEDDING = _POOLING | {"dimensions", "encoding_format", "embed_dtype", "endianness"}
_SCORING = _MODEL | {"chat_template_kwargs", "instruction", "max_tokens_per_doc", "max_tokens_per_query",
                     "truncate_prompt_tokens", "truncation_side", "padding", "use_activation", "user", "cache_salt"}
_SCORE = _SCORING | {"text_1", "text_2", "data_1", "data_2", "queries", "documents", "items"}
_RERANK = _SCORING | {"query", "documents", "top_n"}

FIELDS: dict[str, frozenset[str]] = {path: frozenset(fields) for path, fields in {
    "/tokenize": _MODEL | _TEMPLATE | {"prompt", "return_token_strs", "tools"},
    "/detokenize": _MODEL | {"tokens"},
    "/v1/embeddings": _EMBEDDING,
    "/v2/embed": _MODEL | {"texts", "images", "inputs", "input_type", "embedding_types", "output_dimension",
                           "truncate", "max_tokens"},
    "/pooling": _EMBEDDING | {"task", "data"},
    "/classify": _POOLING,
    "/score": _SCORE,
    "/v1/score": _SCORE,
    "/rerank": _RERANK,
    "/v1/rerank": _RERANK,
    "/v2/rerank": _RERANK,
}.items()}
