"""Exact capture: ask the engine for token ids and sampling logprobs, read them back, and hand the agent
exactly what the engine would have returned for its own request.

vLLM (≥ 0.10.2) semantics: `"return_token_ids": true` adds top-level `prompt_token_ids` (chat; per choice for
completions) and `choices[i].token_ids`; chat `"logprobs": true` / completions `"logprobs": 0` add the sampled
tokens' logprobs. Without them vLLM still emits those keys with `null` (non-streaming responses are dumped
with every field; stream chunks carry them as explicit nulls), so removing what we added means setting the
key back to null where it appears.

How each call was sampled is captured here too (`altered_sampling`), as far as its recorded log-probs depend on
it (`calls.sampling`, core/sampling_rules.py).

The engines run with `--logprobs-mode processed_logprobs` (engine/command.py): a call's log-probs are those its
tokens were sampled with, after temperature and top-k/top-p (docs/vllm-wire-format.md section 12). The trainer
rebuilds that distribution from its own logits (trainer/logprobs.py), so a call sampled at temperature 0.7 with
top_p 0.95 is recorded as `temperature=0.7 top_p=0.95` and trained as it was sampled. What the trainer cannot
rebuild (penalties, logit bias, a grammar, a forced tool, a thinking budget, min_p) is named by its first field,
and the trainer skips such a call under its own reason (trainer/sampled.py).

Read from the body sent upstream (every wire format translated to the engine's), with absent fields at vLLM's
defaults: the engine is started with `--generation-config vllm`, so a model's own generation_config.json (Qwen3:
temperature 0.6, top_p 0.95, top_k 20) does not silently change what an absent field means.
"""
from __future__ import annotations

import json

import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from core.sampling_rules import Sampled
from store.records import ChoiceRecord

CHAT = "chat"
COMPLETIONS = "completions"


@dataclass(slots=True, frozen=True)
class Additions:
    """What the proxy asked for on its own, to be removed before the agent sees the response."""

    token_ids: bool
    logprobs: bool
    requested_model: str
    upstream_model: str

    @property
    def rewrites_model(self) -> bool:
        return self.requested_model != self.upstream_model

    @property
    def any(self) -> bool:
        """Whether responses need rewriting at all; if not, the engine's bytes are relayed untouched."""
        return self.token_ids or self.logprobs or self.rewrites_model


def prepare_upstream_body(body: dict[str, Any], route: str, upstream_model: str) -> tuple[dict[str, Any], Additions]:
    """The body to send upstream: the agent's own, plus capture fields it did not ask for."""
    out = dict(body)
    add_ids = not out.get("return_token_ids")
    if add_ids:
        out["return_token_ids"] = True
    if route == CHAT:
        add_logprobs = not out.get("logprobs")
        if add_logprobs:
            out["logprobs"] = True
    else:
        add_logprobs = out.get("logprobs") is None
        if add_logprobs:
            out["logprobs"] = 0
    out["model"] = upstream_model
    return out, Additions(add_ids, add_logprobs, body["model"], upstream_model)


# An id list as any JSON writer may lay it out (`"token_ids":[1,2]` or `"token_ids": [1, 2]`).
_ID_LISTS = re.compile(rb'"(prompt_token_ids|token_ids)"(\s*):(\s*)\[[0-9,\s]*\]')


def engine_whole_json(payload: Any) -> bytes:
    """A whole (not streamed) body written as vLLM writes one (Starlette's JSONResponse: `json.dumps`, compact, not
    ASCII-escaped). Its stream chunks are written by pydantic, whose floats orjson writes alike; a whole body's
    are not (`-1e-05` here, `-0.00001` there), so one the proxy must write again is written this way."""
    return json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def relay_bytes(raw: bytes, payload: dict[str, Any], additions: Additions, *, whole: bool = False) -> bytes:
    """The bytes the agent gets for a response or chunk the engine sent as `raw` (already parsed as `payload`).

    Untouched when nothing was added. When only token ids were added (the agent asked for logprobs itself),
    the id lists are nulled and the model name put back in the engine's own bytes, so its number formatting
    survives exactly; the edit is checked against the parsed payload (every id list found, the model name found
    once), and when the engine's JSON is laid out in a way the edit does not recognise, the stripped payload is
    serialised again instead. Otherwise (logprobs added) it is serialised again anyway: no engine floats remain."""
    if not additions.any:
        return raw
    write = engine_whole_json if whole else orjson.dumps
    if not additions.logprobs:
        out = raw
        if additions.token_ids:
            out, found = _ID_LISTS.subn(rb'"\1"\2:\3null', out)
            if found != _id_list_count(payload):
                return write(strip_additions(payload, additions))
        if additions.rewrites_model and payload.get("model") == additions.upstream_model:
            name = re.compile(rb'"model"(\s*):(\s*)' + re.escape(orjson.dumps(additions.upstream_model)))
            requested = orjson.dumps(additions.requested_model)
            out, found = name.subn(lambda m: b'"model"' + m[1] + b":" + m[2] + requested, out, count=1)
            if found != 1:
                return write(strip_additions(payload, additions))
        return out
    return write(strip_additions(payload, additions))


def _id_list_count(payload: dict[str, Any]) -> int:
    """How many id lists (not nulls) the payload holds: top-level prompt ids, and each choice's."""
    count = isinstance(payload.get("prompt_token_ids"), list)
    for choice in payload.get("choices") or ():
        if isinstance(choice, dict):
            count += isinstance(choice.get("token_ids"), list) + isinstance(choice.get("prompt_token_ids"), list)
    return count


def only_for_capture(chunk: dict[str, Any], additions: Additions) -> bool:
    """A chat chunk that exists only because the proxy asked for ids and logprobs: vLLM sends a token that
    produces no text (a split multi-byte character, a tool call's tag, the end token) as an empty delta when
    either is asked for (chat_completion/serving.py), so an agent that asked for one of them gets those chunks
    from the engine too, and only when the proxy added both are they its own. A usage chunk of
    `continuous_usage_stats` is one of them as well (choices empty: the final usage chunk is kept)."""
    if not (additions.token_ids and additions.logprobs):
        return False
    choices = chunk.get("choices")
    return bool(choices) and all(c.get("delta") == {} and c.get("finish_reason") is None for c in choices)


def _token_logprobs(route: str, logprobs: Any) -> list[float] | None:
    if not isinstance(logprobs, dict):
        return None
    if route == CHAT:
        content = logprobs.get("content")
        return [entry["logprob"] for entry in content] if content is not None else None
    values = logprobs.get("token_logprobs")
    return list(values) if values is not None else None


def capture_response(route: str, payload: dict[str, Any]) -> tuple[list[int] | None, list[ChoiceRecord]]:
    """Prompt ids and per-choice completion ids/logprobs from a non-streamed response."""
    prompt_ids = payload.get("prompt_token_ids")
    choices = []
    for choice in payload.get("choices") or []:
        if prompt_ids is None and choice.get("prompt_token_ids") is not None:
            prompt_ids = choice["prompt_token_ids"]
        choices.append(
            ChoiceRecord(
                index=choice.get("index", len(choices)),
                token_ids=choice.get("token_ids"),
                logprobs=_token_logprobs(route, choice.get("logprobs")),
                finish_reason=choice.get("finish_reason"),
            )
        )
    return prompt_ids, choices


def strip_additions(payload: dict[str, Any], additions: Additions) -> dict[str, Any]:
    """Undo what the proxy added, in place (works for responses and stream chunks alike)."""
    if additions.rewrites_model and "model" in payload:
        payload["model"] = additions.requested_model
    if additions.token_ids and "prompt_token_ids" in payload:
        payload["prompt_token_ids"] = None
    for choice in payload.get("choices") or ():
        if additions.token_ids:
            if "token_ids" in choice:
                choice["token_ids"] = None
            if "prompt_token_ids" in choice:
                choice["prompt_token_ids"] = None
        if additions.logprobs and "logprobs" in choice:
            choice["logprobs"] = None
    return payload


@dataclass(slots=True)
class _ChoiceState:
    index: int
    role: str | None = None
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    have_ids: bool = False
    have_logprobs: bool = False
    finish_reason: str | None = None
    stop_reason: Any = None


class StreamAssembler:
    """Rebuilds a streamed call from its chunks: the response the agent effectively received, plus ids."""

    def __init__(self, route: str) -> None:
        self.route = route
        self.prompt_ids: list[int] | None = None
        self.head: dict[str, Any] = {}
        self.usage: dict[str, Any] | None = None
        self.choices: dict[int, _ChoiceState] = {}
        self.chunks = 0

    def feed(self, chunk: dict[str, Any]) -> None:
        """Take one parsed chunk as the engine sent it (before `strip_additions`)."""
        self.chunks += 1
        if not self.head:
            self.head = {k: chunk.get(k) for k in ("id", "created", "model", "system_fingerprint")}
        if chunk.get("prompt_token_ids") is not None:
            self.prompt_ids = list(chunk["prompt_token_ids"])
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for raw in chunk.get("choices") or ():
            index = raw.get("index", 0)
            state = self.choices.get(index) or self.choices.setdefault(index, _ChoiceState(index))
            if raw.get("prompt_token_ids") is not None and self.prompt_ids is None:
                self.prompt_ids = list(raw["prompt_token_ids"])
            if raw.get("token_ids") is not None:
                state.have_ids = True
                state.token_ids.extend(raw["token_ids"])
            values = _token_logprobs(self.route, raw.get("logprobs"))
            if values is not None:
                state.have_logprobs = True
                state.logprobs.extend(values)
            if raw.get("finish_reason") is not None:
                state.finish_reason = raw["finish_reason"]
                state.stop_reason = raw.get("stop_reason")
            if self.route == CHAT:
                self._feed_delta(state, raw.get("delta") or {})
            elif raw.get("text"):
                state.text.append(raw["text"])

    @staticmethod
    def _feed_delta(state: _ChoiceState, delta: dict[str, Any]) -> None:
        if delta.get("role"):
            state.role = delta["role"]
        if delta.get("content"):
            state.text.append(delta["content"])
        for key in ("reasoning", "reasoning_content"):
            if delta.get(key):
                state.reasoning.append(delta[key])
        for call in delta.get("tool_calls") or ():
            slot = state.tool_calls.setdefault(
                call.get("index", len(state.tool_calls)),
                {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
            )
            if call.get("id"):
                slot["id"] = call["id"]
            if call.get("type"):
                slot["type"] = call["type"]
            function = call.get("function") or {}
            if function.get("name"):
                slot["function"]["name"] += function["name"]
            if function.get("arguments"):
                slot["function"]["arguments"] += function["arguments"]

    def choice_records(self) -> list[ChoiceRecord]:
        return [
            ChoiceRecord(
                index=s.index,
                token_ids=s.token_ids if s.have_ids else None,
                logprobs=s.logprobs if s.have_logprobs else None,
                finish_reason=s.finish_reason,
            )
            for s in sorted(self.choices.values(), key=lambda s: s.index)
        ]

    def response(self, requested_model: str) -> dict[str, Any]:
        """The non-streamed equivalent of what the agent saw (ids and logprobs live in their own columns)."""
        choices = []
        for s in sorted(self.choices.values(), key=lambda s: s.index):
            if self.route == CHAT:
                message: dict[str, Any] = {"role": s.role or "assistant", "content": "".join(s.text) or None}
                if s.reasoning:
                    message["reasoning"] = "".join(s.reasoning)
                if s.tool_calls:
                    message["tool_calls"] = [s.tool_calls[i] for i in sorted(s.tool_calls)]
                choices.append({"index": s.index, "message": message, "finish_reason": s.finish_reason,
                                "stop_reason": s.stop_reason})
            else:
                choices.append({"index": s.index, "text": "".join(s.text), "finish_reason": s.finish_reason,
                                "stop_reason": s.stop_reason})
        return {
            "id": self.head.get("id"),
            "object": "chat.completion" if self.route == CHAT else "text_completion",
            "created": self.head.get("created"),
            "model": requested_model,
            "choices": choices,
            "usage": self.usage,
        }


# field -> the values that leave the distribution as the raw log-probs describe it
_NEUTRAL: dict[str, Any] = {
    "min_p": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "min_tokens": (0,),  # the end-of-sequence token is masked until then
    "ignore_eos": (False,),
}
# present and not empty: each masks or shifts some tokens' probabilities
_CONSTRAINTS = ("logit_bias", "allowed_token_ids", "bad_words", "structured_outputs")


def altered_sampling(upstream_body: dict[str, Any]) -> str | None:
    """How the call's distribution differs from vLLM's neutral one: the first field the trainer cannot rebuild
    (as `name=value` or `name`), else the temperature, top_p and top_k it can (`temperature=0.7 top_p=0.95`),
    else None (sampled at temperature 1 from the whole vocabulary)."""
    for name, neutral in _NEUTRAL.items():
        value = upstream_body.get(name)
        if value is not None and value not in neutral:
            return f"{name}={value}"
    for name in _CONSTRAINTS:
        if upstream_body.get(name):
            return name
    budget = upstream_body.get("thinking_token_budget")
    if budget is not None:  # once spent, the sampler forces the end-of-thinking tokens, whatever their log-probs
        return f"thinking_token_budget={budget}"
    response_format = upstream_body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") not in (None, "text"):
        return f"response_format={response_format.get('type')}"
    best_of, n = upstream_body.get("best_of"), upstream_body.get("n") or 1
    if isinstance(best_of, int) and best_of > n:  # the returned completions were picked from more
        return f"best_of={best_of}"
    tool_choice = upstream_body.get("tool_choice")
    if tool_choice == "required" or isinstance(tool_choice, dict):  # vLLM forces these with a grammar
        return "tool_choice=required" if tool_choice == "required" else "tool_choice=named"
    return _reproducible(upstream_body)


def _reproducible(body: dict[str, Any]) -> str | None:
    """`temperature=... top_p=... top_k=...` for the settings that are not neutral (a value the engine will refuse
    is named as it came: the call fails there and is never trained)."""
    temperature, top_p, top_k = body.get("temperature"), body.get("top_p"), body.get("top_k")
    try:
        sampled = Sampled(temperature=1.0 if temperature is None else float(temperature),
                          top_p=1.0 if top_p is None else float(top_p),
                          top_k=0 if top_k is None or top_k == -1 else int(top_k))
    except (TypeError, ValueError):
        return f"temperature={temperature}"[:64]
    return sampled.describe()
