"""The request boundary: every JSON body that reaches the engine crosses it once, on every route (chat,
completions, Responses, Messages, count_tokens and the relayed engine routes of proxy/edge/engine_routes.py).

    parse     the body's bytes, once, by one set of rules (`read_json_object`): UTF-8 JSON as RFC 8259 has it,
              one object, nothing else: no NaN or Infinity, no byte order mark, no other encoding (UTF-16/32),
              no lone surrogate escapes, no key twice in one object, no nesting past `MAX_JSON_DEPTH`
    check     the parsed object: the fields the route takes (proxy/dialects/fields.py; the relayed routes'
              proxy/edge/engine_routes.py `FIELDS`; plus what the operator allows), no field that steers the engine,
              the models the key may call (proxy/tenancy.py), the token budget (`Budget`)
    forward   the bytes serialised from that checked object (`engine_bytes`), never the client's own

The engine reads JSON more leniently than these rules (vLLM parses with Python's `json`, which takes NaN, a BOM,
UTF-16/32 and lone surrogates, and keeps the last of two equal keys): a body the proxy read one way could be read
another way by the engine. So nothing the rules refuse is relayed, and what is relayed is what was checked,
whatever the client's bytes said. Refusals are 400 in the route's own error shape (the error middleware writes
Anthropic's on the Messages routes)."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from proxy.dialects.fields import STEERING, refuse_steering, refuse_unknown_openai
from proxy.errors import InvalidRequest
from proxy.strict_json import engine_bytes, read_json_object

__all__ = ["Budget", "RequestBoundary", "engine_bytes", "read_json_object"]

TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")  # chat, Messages; Responses
CHOICE_FIELDS = ("n", "best_of")  # completions a request may ask for at once
DEFAULT_MAX_TOKENS = {"completions": 16}  # the API's own default where it has one (chat's: the context length)


class Budget:
    """`--max-tokens` and `--max-n`: how much one call may generate, whether or not the client said."""

    def __init__(self, max_tokens: int | None, max_n: int | None) -> None:
        self.max_tokens = max_tokens
        self.max_n = max_n

    def check(self, body: dict[str, Any]) -> None:
        """The client's own budget fields: each within the proxy's limit (400 naming the field)."""
        if self.max_tokens:
            for name in TOKEN_FIELDS:
                _check_count(body, name, self.max_tokens)
        if self.max_n:
            for name in CHOICE_FIELDS:
                _check_count(body, name, self.max_n)

    def bound(self, engine_body: dict[str, Any], route: str) -> None:
        """The engine's request, bounded: with a `--max-tokens`, `max_tokens` is set when the request has no
        budget of its own (absent or null), to the API's default where it has one and that is lower; and
        `min_tokens` must fit within the budget the call ends up with (else 400: the call cannot be served as
        asked, and a silent change would answer a different request). `ignore_eos` is bounded by it too."""
        if not self.max_tokens:
            return
        if engine_body.get("max_tokens") is None and engine_body.get("max_completion_tokens") is None:
            engine_body.pop("max_completion_tokens", None)
            engine_body["max_tokens"] = min(self.max_tokens, DEFAULT_MAX_TOKENS.get(route, self.max_tokens))
        budget = min(value for value in (engine_body.get("max_tokens"), engine_body.get("max_completion_tokens"))
                     if value is not None)
        minimum = engine_body.get("min_tokens")
        if minimum is not None:
            if isinstance(minimum, bool) or not isinstance(minimum, int):
                raise InvalidRequest("min_tokens must be an integer", param="min_tokens", code="invalid_type")
            if minimum > budget:
                raise InvalidRequest(f"min_tokens is {minimum}, above this call's max_tokens of {budget} (this "
                                     f"proxy's limit is {self.max_tokens})", param="min_tokens",
                                     code="min_tokens_too_large")


def _check_count(body: dict[str, Any], name: str, limit: int) -> None:
    value = body.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{name} must be an integer", param=name, code="invalid_type")
    if value > limit:
        raise InvalidRequest(f"{name} is {value}, above this proxy's limit of {limit}", param=name,
                             code=f"{name}_too_large")


# Chat content parts vLLM loads from a URL (every wire format's media parts arrive as these once translated).
MEDIA_PARTS = ("image_url", "video_url", "audio_url", "file")
TEXT_PARTS = ("text", "refusal")  # every other part type carries media the trainer cannot see
FETCHED = ("http:", "https:", "file:")  # a data: URL is the media itself; these the engine would go and get


def content_parts(engine_body: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """Each typed content part of the engine's chat request: (where, its type, the part)."""
    for m, message in enumerate(engine_body.get("messages") or ()):
        content = message.get("content") if isinstance(message, dict) else None
        for c, part in enumerate(content if isinstance(content, list) else ()):
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str):
                yield f"messages.{m}.content.{c}", kind, part


def fetched_media(engine_body: dict[str, Any]) -> str | None:
    """Where the engine's chat request names media by a URL it would fetch (`messages.2.content.0`), or None."""
    for where, kind, part in content_parts(engine_body):
        if kind in MEDIA_PARTS:
            target = part.get(kind)
            url = target.get("url") if isinstance(target, dict) else target
            if isinstance(url, str) and url.strip().lower().startswith(FETCHED):
                return where
    return None


def media_in_prompt(engine_body: dict[str, Any]) -> str | None:
    """The first part of the prompt that is not text (an image, audio, a video, a file), as `media=<type>`, or
    None. The engine conditions on its pixels or samples; the trainer sees only the placeholder token ids the
    chat template put in its place, so it cannot compute the log-probs such a call was sampled with."""
    for _, kind, _ in content_parts(engine_body):
        if kind not in TEXT_PARTS:
            return f"media={kind}"[:64]
    return None


class RequestBoundary:
    """The checks of the parsed object that every route shares: the operator's extra fields (`allowed`),
    the steering fields refused everywhere, the template arguments, media by URL, and the budget."""

    def __init__(self, allowed: tuple[str, ...] = (), max_tokens: int | None = None,
                 max_n: int | None = None, media_urls: bool = False) -> None:
        self.allowed = frozenset(allowed)
        self.budget = Budget(max_tokens, max_n)
        self.media_urls = media_urls

    def check_media(self, engine_body: dict[str, Any]) -> None:
        """A multimodal engine fetches an image, video or audio URL from wherever it points, from inside the
        operator's network (vLLM allows every domain unless told otherwise): refused unless the operator allows
        it. Media sent inline (a data: URL) passes; a text model refuses media itself."""
        if not self.media_urls and (where := fetched_media(engine_body)):
            raise InvalidRequest(f"{where}: media by URL would be fetched by the engine from wherever it points; "
                                 "send it inline as a data: URL (the operator may allow URLs: --allow-media-urls)",
                                 param=where, code="media_url_refused")

    def fields(self, known: frozenset[str]) -> frozenset[str]:
        """A route's fields and the ones the operator allows besides."""
        return known | self.allowed if self.allowed else known

    def check_common(self, body: dict[str, Any]) -> None:
        """What every route refuses: a steering field the operator did not allow, and a raw template passed
        in by way of the template's arguments."""
        for name in body:
            if name in STEERING and name not in self.allowed:
                refuse_steering(name)
        arguments = body.get("chat_template_kwargs")
        if arguments is not None:
            if not isinstance(arguments, dict):
                raise InvalidRequest("chat_template_kwargs must be an object", param="chat_template_kwargs",
                                     code="invalid_type")
            if "chat_template" in arguments and "chat_template" not in self.allowed:
                refuse_steering("chat_template")

    def carry_allowed(self, body: dict[str, Any], engine_body: dict[str, Any]) -> None:
        """Fields the operator allows, copied into a request the proxy translated (Responses, Messages), where
        the engine would otherwise never see them."""
        for name in self.allowed:
            if name in body and name not in engine_body:
                engine_body[name] = body[name]

    def relayed(self, raw: bytes, known: frozenset[str]) -> dict[str, Any]:
        """A relayed engine route's body, read and checked: its fields among `known` (the route's, proxy/
        engine_routes.py `FIELDS`) and the operator's (the `model` is checked by the caller, with the key's
        project)."""
        body = read_json_object(raw)
        self.check_common(body)
        refuse_unknown_openai(body, self.fields(known))
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise InvalidRequest("model must be a string", param="model", code="invalid_type")
        return body
