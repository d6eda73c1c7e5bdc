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
request, so no spelling of a path (dot segments, encoded slashes) can reach another route. Pure data: the
routes module relays, the auth and limits middlewares treat these like the other OpenAI routes.
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
