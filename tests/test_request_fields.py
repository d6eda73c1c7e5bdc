"""Every field the official SDKs' request types have is one the Responses and Messages routes take: a client built
on the installed `openai` or `anthropic` package is never refused a field it may send (an SDK upgrade that adds
one fails here until proxy/dialects/fields.py lists it)."""
from __future__ import annotations

import pytest

from proxy.dialects import fields


def keys(typed_dict) -> set[str]:
    return set(typed_dict.__required_keys__ | typed_dict.__optional_keys__)


def test_every_openai_responses_field_is_taken():
    from openai.types.responses import response_create_params as params

    for request in (params.ResponseCreateParamsStreaming, params.ResponseCreateParamsNonStreaming):
        assert keys(request) - fields.RESPONSES == set()


@pytest.mark.parametrize("module,known", [
    ("anthropic.types.message_create_params", fields.MESSAGES),
    ("anthropic.types.beta.message_create_params", fields.MESSAGES),
])
def test_every_anthropic_messages_field_is_taken(module, known):
    params = pytest.importorskip(module)

    for request in (params.MessageCreateParamsStreaming, params.MessageCreateParamsNonStreaming):
        assert keys(request) - known == set()


@pytest.mark.parametrize("module", ["anthropic.types.message_count_tokens_params",
                                    "anthropic.types.beta.message_count_tokens_params"])
def test_every_anthropic_count_tokens_field_is_taken(module):
    params = pytest.importorskip(module)

    assert keys(params.MessageCountTokensParams) - fields.COUNT_TOKENS == set()


@pytest.mark.parametrize("params,known", [
    ("openai.types.chat.completion_create_params", fields.CHAT),
    ("openai.types.completion_create_params", fields.COMPLETIONS),
])
def test_every_openai_chat_and_completions_field_is_taken(params, known):
    module = pytest.importorskip(params)

    for request in (module.CompletionCreateParamsStreaming, module.CompletionCreateParamsNonStreaming):
        assert keys(request) - known == set()


# vLLM fields the generation routes ignore (they act on its render routes only): neither taken nor refused with a
# reason, they get the plain "unknown parameter".
RENDER_ONLY = {"return_token_offsets", "mm_payload", "return_mm_kwargs"}


# Fields vLLM's own Responses and Messages routes take that the proxy's translation to chat does not carry (its
# Responses keeps conversation state itself: vLLM's `enable_response_messages`/`previous_input_messages` are
# that state's engine-side form): unknown parameters there.
NOT_TRANSLATED = {
    "ResponsesRequest": {"cache_salt", "enable_response_messages", "include_reasoning", "previous_input_messages",
                         "structured_outputs", "watermarking"},
    "AnthropicMessagesRequest": {"cache_salt", "watermarking"},
}


@pytest.mark.parametrize("module,name,known", [
    ("vllm.entrypoints.openai.chat_completion.protocol", "ChatCompletionRequest", fields.CHAT),
    ("vllm.entrypoints.openai.completion.protocol", "CompletionRequest", fields.COMPLETIONS),
    ("vllm.entrypoints.openai.responses.protocol", "ResponsesRequest", fields.RESPONSES),
    ("vllm.entrypoints.anthropic.protocol", "AnthropicMessagesRequest", fields.MESSAGES),
])
def test_every_field_the_engine_takes_is_decided(module, name, known):
    """Each field of the installed vLLM's request is taken by the proxy's route, refused with the reason it
    steers the engine, or one of its render-only fields: a vLLM upgrade that adds one fails here until it is
    decided (proxy/dialects/fields.py)."""
    request = getattr(pytest.importorskip(module), name)
    undecided = set(request.model_fields) - known - fields.STEERING.keys() - RENDER_ONLY
    assert undecided == NOT_TRANSLATED.get(name, set())


def test_steering_fields_are_no_field_a_route_takes():
    for known in (fields.CHAT, fields.COMPLETIONS, fields.RESPONSES, fields.MESSAGES, fields.COUNT_TOKENS):
        assert known & fields.STEERING.keys() == set()


TOKENIZE = "vllm.entrypoints.serve.tokenize.protocol"
EMBED = "vllm.entrypoints.pooling.embed.protocol"
POOLING = "vllm.entrypoints.pooling.pooling.protocol"
CLASSIFY = "vllm.entrypoints.pooling.classify.protocol"
SCORING = "vllm.entrypoints.pooling.scoring.protocol"
SCORE = [(SCORING, name) for name in ("ScoreDataRequest", "ScoreQueriesDocumentsRequest", "ScoreQueriesItemsRequest",
                                      "ScoreTextRequest")]
RELAYED_REQUESTS = {  # the request types vLLM 0.32 reads each relayed route's body as
    "/tokenize": [(TOKENIZE, "TokenizeCompletionRequest"), (TOKENIZE, "TokenizeChatRequest")],
    "/detokenize": [(TOKENIZE, "DetokenizeRequest")],
    "/v1/embeddings": [(EMBED, name) for name in ("EmbeddingCompletionRequest", "EmbeddingChatRequest",
                                                  "EmbeddingBatchChatRequest", "EmbeddingChatInputRequest")],
    "/v2/embed": [(EMBED, "CohereEmbedRequest")],
    "/pooling": [(POOLING, name) for name in ("PoolingCompletionRequest", "PoolingChatRequest",
                                              "IOProcessorRequest")],
    "/classify": [(CLASSIFY, "ClassificationCompletionRequest"), (CLASSIFY, "ClassificationChatRequest")],
    "/score": SCORE, "/v1/score": SCORE,
    "/rerank": [(SCORING, "RerankRequest")], "/v1/rerank": [(SCORING, "RerankRequest")],
    "/v2/rerank": [(SCORING, "RerankRequest")],
}


@pytest.mark.parametrize("path", sorted(RELAYED_REQUESTS))
def test_a_relayed_route_takes_the_engines_fields_but_the_steering_ones(path):
    from proxy.edge.engine_routes import FIELDS

    engine = set()
    for module, name in RELAYED_REQUESTS[path]:
        engine |= set(getattr(pytest.importorskip(module), name).model_fields)
    assert FIELDS[path] == engine - fields.STEERING.keys()
