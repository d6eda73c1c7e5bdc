"""How the stand-in engine (testkit/stub_engine.py) writes what it generated, field for field as vLLM's OpenAI
server does: one chat or text completion body, or the same as server-sent chunks, with the stream faults of
testkit/stub_faults.py on the way. Apart from the engine so that what the stand-in answers (its tokens, its tool
calls, its adapters) and how that is spelled on the wire are read, and changed, one at a time."""
from __future__ import annotations

import asyncio
import hashlib
import json
import time
from typing import Callable

from aiohttp import web

from testkit.stub_faults import EndStream, stream_fault

# One generated choice: its words, its token ids (the end token after the words when it stopped), its tool call
# (or None) and its finish reason.
Choice = tuple[list[str], list[int], dict | None, str]
LogProb = Callable[[int, dict], float]  # a completion token's logprob by its position, for the request's body


def dumps(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def token_logprobs(body: dict, chat: bool, words: list[str], ids: list[int], logprob: LogProb):
    """The `logprobs` of a choice or a chunk, where the request asked for them, in the route's own shape."""
    wanted = body.get("logprobs") if chat else body.get("logprobs") is not None
    if not wanted:
        return None
    values = [logprob(i, body) for i in range(len(ids))]
    pieces = words + [""] * (len(ids) - len(words))
    if chat:
        return {"content": [{"token": p, "logprob": v, "bytes": list(p.encode()), "top_logprobs": []}
                            for p, v in zip(pieces, values)]}
    return {"text_offset": list(range(len(ids))), "token_logprobs": values, "tokens": pieces,
            "top_logprobs": [{p: v} for p, v in zip(pieces, values)]}


def whole_answer(body: dict, chat: bool, prompt_ids: list[int], choices: list[Choice], logprob: LogProb,
                 prompt_scores: list[dict | None] | None = None) -> dict:
    """The answer of a request without `stream` (or with "stub_plain_json"): one chat or text completion body;
    `prompt_scores`, a completion's `prompt_logprobs` where it asked for them."""
    want_ids = bool(body.get("return_token_ids"))
    out_choices = []
    for index, (words, ids, tool_call, finish) in enumerate(choices):
        text = " ".join(words)
        if chat:
            message = {"role": "assistant", "content": None if tool_call else text, "refusal": None,
                       "annotations": None, "audio": None, "function_call": None,
                       "tool_calls": [tool_call] if tool_call else [], "reasoning": None}
            out_choices.append({"index": index, "message": message,
                                "logprobs": token_logprobs(body, chat, words, ids, logprob), "finish_reason": finish,
                                "stop_reason": None, "token_ids": ids if want_ids else None})
        else:
            out_choices.append({"index": index, "text": text,
                                "logprobs": token_logprobs(body, chat, words, ids, logprob), "finish_reason": finish,
                                "stop_reason": None, "prompt_logprobs": prompt_scores,
                                "prompt_token_ids": prompt_ids if want_ids else None,
                                "token_ids": ids if want_ids else None})
    completion_tokens = sum(len(c[1]) for c in choices)
    response = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{hashlib.md5(dumps(prompt_ids)).hexdigest()}",
                "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": body["model"], "choices": out_choices, "service_tier": None,
                "system_fingerprint": None,
                "usage": {"prompt_tokens": len(prompt_ids), "total_tokens": len(prompt_ids) + completion_tokens,
                          "completion_tokens": completion_tokens, "prompt_tokens_details": None},
                "prompt_logprobs": None, "kv_transfer_params": None}
    if chat:
        response["prompt_token_ids"] = prompt_ids if want_ids else None
    return response


async def streamed_answer(request: web.Request, body: dict, chat: bool, prompt_ids: list[int], choices: list[Choice],
                          logprob: LogProb) -> web.StreamResponse:
    """The answer of a `stream: true` request: a chunk a token (a chat's first chunk its role, a tool call in two
    deltas), `[DONE]` at the end, the controls' faults on the way ("stub_delay", "stub_die_after", stub_faults.py)."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await response.prepare(request)
    want_ids = bool(body.get("return_token_ids"))
    delay = float(body.get("stub_delay") or 0)
    die_after = body.get("stub_die_after")
    cid = f"{'chatcmpl' if chat else 'cmpl'}-{hashlib.md5(dumps(prompt_ids)).hexdigest()}"
    created = int(time.time())
    sent = 0

    async def send(payload: dict) -> None:
        nonlocal sent
        if die_after is not None and sent >= die_after:
            request.transport.close()
            raise ConnectionResetError("stub engine died")
        if (failure := stream_fault(body, sent)) is not None:
            await response.write(failure)
            raise EndStream(done=True)
        await response.write(b"data: " + dumps(payload) + b"\n\n")
        sent += 1
        if delay:
            await asyncio.sleep(delay)

    head = {"id": cid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
            "model": body["model"]}
    try:
        for index, (words, ids, tool_call, finish) in enumerate(choices):
            if chat:
                first = {**head, "choices": [{"index": index, "delta": {"role": "assistant", "content": ""},
                                              "logprobs": None, "finish_reason": None}],
                         "prompt_token_ids": prompt_ids if want_ids and index == 0 else None}
                await send(first)
            pieces = [(" " if i else "") + w for i, w in enumerate(words)] + [""] * (len(ids) - len(words))
            for position, (piece, tid) in enumerate(zip(pieces, ids)):
                last = position == len(ids) - 1
                logprobs = token_logprobs(body, chat, [piece.strip()], [tid], logprob)
                if logprobs and chat:
                    logprobs["content"][0]["logprob"] = logprob(position, body)
                elif logprobs:
                    logprobs["token_logprobs"][0] = logprob(position, body)
                    logprobs["text_offset"] = [position]
                choice = {"index": index, "logprobs": logprobs, "finish_reason": finish if last else None,
                          "token_ids": [tid] if want_ids else None}
                if last:
                    choice["stop_reason"] = None
                if chat:
                    if tool_call and position == 0:
                        choice["delta"] = {"tool_calls": [{"id": tool_call["id"], "type": "function", "index": 0,
                                                           "function": {"name": tool_call["function"]["name"],
                                                                        "arguments": ""}}]}
                    elif tool_call and position == 1:
                        choice["delta"] = {"tool_calls": [{"index": 0, "function": {
                            "arguments": tool_call["function"]["arguments"]}}]}
                    elif tool_call or (piece == "" and not last):
                        # a token with no text: vLLM sends it as an empty delta only when the request asked
                        # for logprobs or token ids (chat_completion/serving.py), and skips it otherwise
                        if not (logprobs or want_ids) and not last:
                            continue
                        choice["delta"] = {}
                    else:
                        choice["delta"] = {"content": piece}
                else:
                    choice["text"] = piece
                    if position == 0:
                        choice["prompt_token_ids"] = prompt_ids if want_ids else None
                await send({**head, "choices": [choice]})
        await response.write(b"data: [DONE]\n\n")
    except ConnectionResetError:
        return response
    except EndStream as end:
        await response.write(b"data: [DONE]\n\n" if end.done else b"")
    await response.write_eof()
    return response
