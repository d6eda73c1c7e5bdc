"""OpenAI Chat Completions (`POST /v1/chat/completions`) and legacy Completions (`POST /v1/completions`): the
engine's own wire formats, so these dialects translate nothing. The request goes to the engine as the agent sent
it, once its fields are ones the route takes (proxy/dialects/fields.py), plus the capture fields
(proxy/capture.py) and the budget (proxy/boundary.py); and the answer comes back as the engine sent it, byte for byte,
less what the proxy asked for on its own: token ids and logprobs the agent did not ask for are nulled, and the
model name is put back where a policy's adapter answered (`relay_bytes`).

Completions fits the same mould: only its request model and the engine route differ. A chat stream also drops
the chunks that exist only because the proxy asked for ids or logprobs (`only_for_capture`); a completions
stream has none of those.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from proxy.capture import CHAT, COMPLETIONS, Additions, only_for_capture, relay_bytes, strip_additions
from proxy.dialects.base import ENDED_EARLY, openai_engine_error
from proxy.dialects.fields import CHAT as CHAT_FIELDS
from proxy.dialects.fields import COMPLETIONS as COMPLETIONS_FIELDS
from proxy.dialects.fields import refuse_unknown_openai
from proxy.errors import InvalidRequest, error_body, sse_error_event
from proxy.schemas import only_fields, validate
from proxy.dialects.sse import Event


class _OpenAIRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: StrictStr = Field(min_length=1)
    stream: StrictBool | None = None
    n: StrictInt | None = Field(None, ge=1)


class ChatCompletionRequest(_OpenAIRequest):
    model_config = ConfigDict(extra="allow", json_schema_extra=only_fields(CHAT_FIELDS))

    messages: list[dict[str, Any]] = Field(min_length=1)


class CompletionRequest(_OpenAIRequest):
    model_config = ConfigDict(extra="allow", json_schema_extra=only_fields(COMPLETIONS_FIELDS))

    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]


class Passthrough:
    """The engine's answer relayed as it came, less the proxy's additions."""

    __slots__ = ("additions", "drops_capture_chunks", "final")

    def __init__(self, additions: Additions, drops_capture_chunks: bool) -> None:
        self.additions = additions
        self.drops_capture_chunks = drops_capture_chunks
        self.final: dict[str, Any] | None = None

    def whole(self, payload: dict[str, Any] | None, raw: bytes, tokens: tuple[int, int]) -> bytes:
        if payload is None:
            return raw  # not JSON: the agent gets what the engine sent (the call is recorded as an upstream error)
        body = relay_bytes(raw, payload, self.additions, whole=True)
        self.final = strip_additions(payload, self.additions)
        return body

    def feed(self, chunk: dict[str, Any] | None, event: Event, prompt_tokens: int) -> bytes:
        additions = self.additions
        if chunk is None or not additions.any:
            return event.raw
        if self.drops_capture_chunks and only_for_capture(chunk, additions):
            return b""
        return b"data: " + relay_bytes(event.data.encode(), chunk, additions) + b"\n\n"

    def finish(self, payload: dict[str, Any], tokens: tuple[int, int], done: Event | None) -> bytes:
        # A stream the engine cut short (no [DONE]) ends with an error event, so the agent knows its answer is
        # incomplete, as the call is recorded (failed, never trained on).
        return done.raw if done is not None else self.error(*ENDED_EARLY)

    def error(self, status: int, message: str, kind: str, code: str | None, event: Event | None = None) -> bytes:
        if event is not None:
            return event.raw
        return sse_error_event(error_body(message, kind, code=code))


def one_prompt(prompt: Any) -> None:
    """A recorded call holds one prompt's token ids, and its choices are trained as continuations of it: a
    completions request with several prompts (a list of texts, or of token id lists) would be stored and trained
    under the first prompt's ids, so it is refused. One text, one list of token ids, or a list of one is one."""
    if isinstance(prompt, list) and len(prompt) > 1 and not isinstance(prompt[0], int):
        raise InvalidRequest(f"prompt: rlproxy records one prompt per call and this request has {len(prompt)}; "
                             "send one request per prompt (use `n` for several completions of one prompt)",
                             param="prompt")


class OpenAIDialect:
    """Chat Completions or Completions, relayed."""

    translates = False  # the engine's answer is the agent's, a JSON body to a stream request included

    def __init__(self, route: str, path: str, schema: type[BaseModel], fields: frozenset[str]) -> None:
        self.route = self.engine_route = route
        self.path = self.engine_path = path
        self.schema = schema
        self.fields = fields
        self.drops_capture_chunks = route == CHAT

    def validate(self, body: dict[str, Any], allowed: frozenset[str] = frozenset()) -> None:
        refuse_unknown_openai(body, self.fields | allowed)
        validate(self.schema, body)
        if self.route == COMPLETIONS:
            one_prompt(body["prompt"])
            if body.get("echo"):  # with the ids the proxy asks for, vLLM leaves the prompt's text out of `text`
                raise InvalidRequest("echo: rlproxy records each call's token ids, and with them the engine does "
                                     "not echo the prompt's text; prepend the prompt yourself", param="echo")
            return
        if body.get("include_reasoning") is False:  # vLLM then withholds every token id and logprob
            raise InvalidRequest("include_reasoning: false makes the engine withhold the call's token ids and "
                                 "logprobs, which rlproxy records for training; leave it out, and drop the "
                                 "reasoning from what your agent shows", param="include_reasoning")
        if not body.get("logprobs") and (body.get("top_logprobs") or body.get("logprob_token_ids")):
            name = "top_logprobs" if body.get("top_logprobs") else "logprob_token_ids"
            raise InvalidRequest(f"when using `{name}`, `logprobs` must be set to true", param=name)  # vLLM's words

    def to_chat(self, body: dict[str, Any], history: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return body  # checked by `validate`; the engine's own format

    def translator(self, body: dict[str, Any], call_id: str, created: int, additions: Additions) -> Passthrough:
        return Passthrough(additions, self.drops_capture_chunks)

    def engine_error(self, status: int, raw: bytes) -> bytes:
        return openai_engine_error(status, raw)


CHAT_COMPLETIONS = OpenAIDialect(CHAT, "/v1/chat/completions", ChatCompletionRequest, CHAT_FIELDS)
TEXT_COMPLETIONS = OpenAIDialect(COMPLETIONS, "/v1/completions", CompletionRequest, COMPLETIONS_FIELDS)
