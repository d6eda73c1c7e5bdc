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
