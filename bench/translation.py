"""What translating the OpenAI Responses API and Anthropic Messages to and from the engine's chat route costs the
proxy, measured in-process (no network, no other process): per call, the request checked and translated to chat,
then the engine's answer translated back, whole (JSON) or as a stream of 8 token chunks, like bench/load.py's.
The chat row is the same work for Chat Completions, whose dialect relays the engine's bytes (less the token ids
and logprobs the proxy asked for on its own): the baseline the other two are compared with.

    .venv/bin/python bench/translation.py [--calls 5000] [--rounds 5]

bench/load.py measures the same routes end to end, where the machine's noise is larger than the bound; this
isolates the translation itself. It prints microseconds per call (the fastest of the rounds: other work on the
machine only ever adds time) and the share of the 0.2 ms bound they use.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson  # noqa: E402

from bench.wire_formats import BOUND_MS  # noqa: E402
from proxy.capture import Additions, prepare_upstream_body  # noqa: E402
from proxy.dialects.chat import CHAT_COMPLETIONS  # noqa: E402
from proxy.dialects.messages import MESSAGES  # noqa: E402
from proxy.dialects.responses import RESPONSES  # noqa: E402
from proxy.dialects.sse import Event  # noqa: E402

TOKENS = 8
PROMPT_TOKENS = 30
TOKEN_COUNTS = (PROMPT_TOKENS, TOKENS)
REQUESTS = {
    "chat": (CHAT_COMPLETIONS, {"model": "stub-model", "max_tokens": TOKENS,
                                "messages": [{"role": "user", "content": "Say something."}]}),
    "responses": (RESPONSES, {"model": "stub-model", "input": [{"role": "user", "content": "Say something."}],
                              "max_output_tokens": TOKENS}),
    "messages": (MESSAGES, {"model": "stub-model", "max_tokens": TOKENS,
                            "messages": [{"role": "user", "content": "Say something."}]}),
}


def engine_chunks() -> list[dict]:
    """An engine stream of TOKENS one-word chunks, shaped like vLLM's (token ids and logprobs the proxy asked for)."""
    first = {"id": "c", "object": "chat.completion.chunk", "prompt_token_ids": list(range(PROMPT_TOKENS)),
             "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
    words = [{"id": "c", "object": "chat.completion.chunk",
              "choices": [{"index": 0, "delta": {"content": f" word{i}"}, "token_ids": [100 + i], "finish_reason": None,
                           "logprobs": {"content": [{"token": f" word{i}", "logprob": -0.5}]}}]}
             for i in range(TOKENS)]
    last = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
    return [first, *words, last]


def events(chunks: list[dict]) -> list[tuple[dict, Event]]:
    """Each chunk with the event it came in, as the capture core hands them to a translator."""
    return [(chunk, Event(orjson.dumps(chunk).decode(), b"data: " + orjson.dumps(chunk) + b"\n\n"))
            for chunk in chunks]


def answer(chunks: list[dict]) -> dict:
    """The engine's whole answer for the same tokens."""
    text = "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks)
    return {"id": "c", "object": "chat.completion", "prompt_token_ids": list(range(PROMPT_TOKENS)),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length",
                         "token_ids": [100 + i for i in range(TOKENS)],
                         "logprobs": {"content": [{"token": "w", "logprob": -0.5}] * TOKENS}}]}


DONE = Event("[DONE]", b"data: [DONE]\n\n")


def one_call(dialect, body: dict, stream: bool, stream_events: list[tuple[dict, Event]], whole: tuple[dict, bytes],
             additions: Additions) -> int:
    dialect.validate(body)
    dialect.to_chat(body, ())
    translator = dialect.translator(body, "call", 0, additions)
    if not stream:
        return len(translator.whole(*whole, TOKEN_COUNTS))
    sent = sum(len(translator.feed(chunk, event, PROMPT_TOKENS)) for chunk, event in stream_events)
    return sent + len(translator.finish(whole[0], TOKEN_COUNTS, DONE))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=5000, help="Calls per round.")
    parser.add_argument("--rounds", type=int, default=5, help="Rounds per row; the fastest is printed.")
    args = parser.parse_args()
    chunks = engine_chunks()
    stream_events, raw = events(chunks), orjson.dumps(answer(chunks))
    print(f"translation per call, in-process (the fastest of {args.rounds} rounds of {args.calls} calls, after "
          f"{args.calls // 10} warm-up calls)")
    print(f"{'route':<12}{'mode':<8}{'us/call':>10}{'of the bound':>14}")
    for name, (dialect, body) in REQUESTS.items():
        for stream in (False, True):
            request = {**body, "stream": stream}
            whole = (orjson.loads(raw), raw)  # each row its own: the chat relay strips what the proxy added in place
            # what the proxy asks the engine for on its own (ids, logprobs), as the capture core works it out
            _, additions = prepare_upstream_body(dialect.to_chat(request, ()), dialect.engine_route, "stub-model")
            for _ in range(args.calls // 10):
                one_call(dialect, request, stream, stream_events, whole, additions)
            rounds = []
            for _ in range(args.rounds):
                began = time.perf_counter()
                for _ in range(args.calls):
                    one_call(dialect, request, stream, stream_events, whole, additions)
                rounds.append(time.perf_counter() - began)
            micros = min(rounds) / args.calls * 1e6
            print(f"{name:<12}{'stream' if stream else 'json':<8}{micros:>10.1f}{micros / (BOUND_MS * 1000):>14.0%}")


if __name__ == "__main__":
    main()
