"""Property tests of the two pieces that touch every byte: the SSE parser (any split of a stream gives the
same events; garbage never raises) and request normalization (what the proxy adds to a request is removed from
the answer again; the agent's own fields reach the engine untouched)."""
from __future__ import annotations

import json
import string
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.capture import CHAT, COMPLETIONS, prepare_upstream_body, relay_bytes, strip_additions
from proxy.dialects.sse import SSEParser

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- SSE ---------------------------------------------------------------------------------------------------

line_text = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=40)
event = st.one_of(
    st.lists(line_text, min_size=1, max_size=3).map(lambda lines: ("data", lines)),
    line_text.map(lambda comment: ("comment", [comment])),
    st.just(("done", ["[DONE]"])),
)


def render(events: list[tuple[str, list[str]]], newline: bytes) -> tuple[bytes, list[str | None]]:
    """An event stream as an engine would write it, and the data each event carries."""
    out, expected = b"", []
    for kind, lines in events:
        if kind == "comment":
            out += b":" + lines[0].encode() + newline + newline
            expected.append(None)
        else:
            out += b"".join(b"data: " + line.encode() + newline for line in lines) + newline
            expected.append("\n".join(lines))
    return out, expected


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0] + points, points + [len(data)])]


def parse(chunks: list[bytes]) -> list:
    parser = SSEParser()
    events = [e for chunk in chunks for e in parser.feed(chunk)]
    return events + parser.flush()


@FUZZ
@given(st.lists(event, max_size=8), st.sampled_from([b"\n", b"\r\n", b"\r"]),
       st.lists(st.integers(0, 10_000)))
def test_any_split_of_a_stream_gives_the_same_events(events, newline, cuts):
    stream, expected = render(events, newline)
    whole = parse([stream])
    pieces = parse(split(stream, cuts))
    assert [e.data for e in whole] == [e.data for e in pieces] == expected
    assert [e.raw for e in whole] == [e.raw for e in pieces]
    assert [e.is_done for e in pieces] == [kind == "done" for kind, _ in events]
    if newline == b"\n":
        assert b"".join(e.raw for e in pieces) == stream  # relayed byte for byte


@FUZZ
@given(st.lists(st.binary(max_size=64), max_size=12))
def test_garbage_never_raises_and_loses_no_complete_event(chunks):
    events = parse(chunks)
    assert all(e.data is None or isinstance(e.data, str) for e in events)
    data = b"".join(chunks)
    if b"\r" not in data:
        complete = data[: data.rfind(b"\n\n") + 2] if b"\n\n" in data else b""
        relayed = b"".join(e.raw for e in events)
        assert relayed.startswith(complete)


# --- request normalization ----------------------------------------------------------------------------------

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**53, 2**53), st.text(max_size=12),
                      st.floats(allow_nan=False, allow_infinity=False))
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
model_name = st.text(string.ascii_letters + string.digits + "._:/-", min_size=1, max_size=30)
# The fields whose value the proxy may change, with the values agents send for them.
capture_flags = st.fixed_dictionaries({}, optional={
    "return_token_ids": st.one_of(st.none(), st.booleans()),
    "logprobs": st.one_of(st.none(), st.booleans(), st.integers(0, 5)),
    "top_logprobs": st.integers(0, 5),
})


@st.composite
def client_bodies(draw, route: str) -> dict[str, Any]:
    body = draw(st.dictionaries(st.text(max_size=10).filter(lambda k: k not in ("model", "return_token_ids",
                                                                                 "logprobs")),
                                json_value, max_size=5))
    body.update(draw(capture_flags))
    body["model"] = draw(model_name)
    if route == CHAT:
        body["messages"] = draw(st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]),
                                                                "content": st.text(max_size=20)}),
                                         min_size=1, max_size=3))
    else:
        body["prompt"] = draw(st.one_of(st.text(max_size=20), st.lists(st.integers(0, 50_000), max_size=8)))
    return body


def engine_answer(body: dict[str, Any], route: str, seed: int, values: list[float]) -> bytes:
    """What a vLLM-like engine returns for `body`: every key present, the optional ones null unless asked for,
    floats in the engine's own formatting (Python's shortest repr, not orjson's)."""
    ids = [seed % 50_000, (seed * 7) % 50_000, 2]
    want_ids = bool(body.get("return_token_ids"))
    if route == CHAT:
        logprobs = ({"content": [{"token": f"t{i}", "logprob": v, "bytes": [116], "top_logprobs": []}
                                 for i, v in enumerate(values)]} if body.get("logprobs") else None)
        choice = {"index": 0, "message": {"role": "assistant", "content": "The answer is 42"},
                  "logprobs": logprobs, "finish_reason": "stop", "stop_reason": None,
                  "token_ids": ids if want_ids else None}
        payload = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": body["model"],
                   "choices": [choice], "usage": {"prompt_tokens": 3, "completion_tokens": 3},
                   "prompt_token_ids": [1, 2, 3] if want_ids else None}
    else:
        logprobs = ({"tokens": [f"t{i}" for i in range(len(values))], "token_logprobs": values,
                     "top_logprobs": None, "text_offset": list(range(len(values)))}
                    if body.get("logprobs") is not None else None)
        choice = {"index": 0, "text": " 42", "logprobs": logprobs, "finish_reason": "stop",
                  "prompt_token_ids": [1, 2, 3] if want_ids else None, "token_ids": ids if want_ids else None}
        payload = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": body["model"],
                   "choices": [choice], "usage": {"prompt_tokens": 3, "completion_tokens": 3}}
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


@FUZZ
@given(st.sampled_from([CHAT, COMPLETIONS]).flatmap(lambda r: st.tuples(st.just(r), client_bodies(r))),
       model_name)
def test_the_proxy_adds_only_capture_fields_and_keeps_the_agents_own(route_body, upstream_model):
    route, body = route_body
    before = orjson.dumps(body)
    upstream, additions = prepare_upstream_body(body, route, upstream_model)
    assert orjson.dumps(body) == before  # the agent's body is not modified in place
    assert upstream["model"] == upstream_model
    assert upstream["return_token_ids"] is True or upstream["return_token_ids"] == body["return_token_ids"]
    for name, value in body.items():
        if name == "model" or (name == "return_token_ids" and additions.token_ids) or \
                (name == "logprobs" and additions.logprobs):
            continue
        assert orjson.dumps(upstream[name]) == orjson.dumps(value), name  # bit for bit
    assert set(upstream) - set(body) <= {"return_token_ids", "logprobs"}
    assert additions.token_ids == (not body.get("return_token_ids"))


@FUZZ
@given(st.sampled_from([CHAT, COMPLETIONS]).flatmap(lambda r: st.tuples(st.just(r), client_bodies(r))),
       model_name, st.integers(0, 2**31),
       st.lists(st.floats(max_value=0, allow_nan=False, allow_infinity=False), min_size=3, max_size=3))
def test_what_the_proxy_added_is_removed_from_the_answer(route_body, upstream_model, seed, values):
    route, body = route_body
    upstream, additions = prepare_upstream_body(body, route, upstream_model)
    raw = engine_answer(upstream, route, seed, values)
    own = engine_answer(body, route, seed, values)  # what the engine says to the agent's own request
    relayed = relay_bytes(raw, orjson.loads(raw), additions)
    assert orjson.loads(relayed) == orjson.loads(own)
    if not additions.logprobs:  # the engine's own bytes are edited, not re-serialized: floats survive as sent
        assert relayed == own
    assert strip_additions(orjson.loads(raw), additions) == orjson.loads(own)


# --- the request boundary's JSON rules (proxy/strict_json.py) ------------------------------------------------

# Text with the characters that matter to a JSON reader: colons (the repeated-key check counts them), quotes,
# backslashes, and any other character but lone surrogates.
json_text = st.text(st.characters(blacklist_categories=("Cs",)) | st.sampled_from(':"\\'), max_size=8)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(2 ** 63), 2 ** 63 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | json_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(json_text, inner, max_size=4), max_leaves=24)
json_object = st.dictionaries(json_text, json_value, max_size=6)


@FUZZ
@given(json_object, st.booleans())
def test_every_json_object_is_read_as_written_and_sent_as_read(body, ascii_only):
    from proxy.strict_json import engine_bytes, read_json_object

    raw = json.dumps(body, ensure_ascii=ascii_only).encode()  # spaced, escaped or not, as Python writes it
    read = read_json_object(raw)
    assert read == orjson.loads(raw)
    assert orjson.loads(engine_bytes(read)) == read


@FUZZ
@given(json_object, json_text, json_value, st.integers(0, 3))
def test_a_key_written_twice_in_any_object_is_refused(body, key, value, depth):
    from proxy.errors import InvalidRequest
    from proxy.strict_json import read_json_object

    twice = "{" + json.dumps(key) + ": " + json.dumps(value) + ", " + json.dumps({key: "again", **body})[1:]
    raw = twice
    for level in range(depth):  # inside other objects and lists
        raw = '{"a": [' + raw + "]}" if level % 2 else '{"b": ' + raw + "}"
    try:
        read_json_object(raw.encode())
    except InvalidRequest as refused:
        assert refused.code == "invalid_json" and "twice" in refused.message
    else:
        raise AssertionError(f"read {raw!r}")
