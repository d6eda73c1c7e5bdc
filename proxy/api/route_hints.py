"""What a 404 adds when the path is a known route under a mistaken base URL: the clients' usual mistakes
(an OpenAI client given the proxy's URL without `/v1`, the Anthropic SDK, which adds `/v1` itself, given one
with it, the web view without its final slash), said with the path that would have been answered; and, for
any other API path (under a rollout, or `/v1…` at the root), the APIs this proxy serves: a client of an API it
does not serve (an embeddings batch, a Gemini method other than generating) learns what there is."""
from __future__ import annotations

import re

# The part of a path before the API's own: the rollout (and agent) prefixes a client's base URL may carry.
_PREFIX = r"(?P<prefix>(?:/rollouts/[^/]+(?:/agents/[^/]+)?)?)"
_API = r"(?P<api>chat/completions|completions|responses(?:/[^/]+)?|messages(?:/count_tokens)?|models|embeddings)"
_WITHOUT_V1 = re.compile(rf"^{_PREFIX}/{_API}$")
_TWICE_V1 = re.compile(rf"^{_PREFIX}/v1/v1/{_API}$")
_ANY_API = re.compile(r"^(?P<prefix>/rollouts/[^/]+(?:/agents/[^/]+)?)/|^(?P<root>)/v1(?:beta)?(?:/|$)")
SERVED = ("OpenAI Chat Completions /v1/chat/completions, Completions /v1/completions, Responses /v1/responses, "
          "models /v1/models; Anthropic Messages /v1/messages and /v1/messages/count_tokens; the Gemini API "
          "/v1beta/models/{model}:generateContent, :streamGenerateContent?alt=sse, :countTokens (also under /v1) "
          "and /v1beta/models; "
          "the engine's read-only routes (/tokenize, /detokenize, /v1/embeddings, /pooling, /score, /rerank, …)")


def hint(path: str) -> str:
    """A sentence to add to the 404 of `path` ("" when it is not one of these mistakes)."""
    if path == "/ui":
        return " (the web view is at /ui/, with its final slash)"
    if match := _WITHOUT_V1.match(path):
        return (f" (did you mean {match['prefix']}/v1/{match['api']}? An OpenAI client's base URL ends in /v1: "
                f"http://HOST:PORT{match['prefix']}/v1)")
    if match := _TWICE_V1.match(path):
        return (f" (did you mean {match['prefix']}/v1/{match['api']}? The base URL ended in /v1 and the client "
                f"added another: the Anthropic SDK adds /v1 itself, so give it http://HOST:PORT{match['prefix']})")
    if match := _ANY_API.match(path):
        under = f"under {match['prefix']}" if match["prefix"] else "here"
        return f" (served {under}: {SERVED})"
    return ""
