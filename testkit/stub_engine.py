"""A small local server that answers like vLLM's OpenAI server (token ids, logprobs, SSE, tool calls, LoRA
loading), for testing and benchmarking the proxy alone. Deterministic: the same request gives the same answer.

Run it: `python -m testkit.stub_engine --port 8001` (`--model NAME` serves the base model under another name,
e.g. a real engine's, so both can be replicas behind one proxy).

Test controls, read from the request body (unknown fields pass through the proxy untouched):
  "stub_delay": seconds to sleep per streamed token;
  "stub_die_after": close the connection after this many stream chunks (an engine crash mid-stream);
  "stub_end_after", "stub_error_after": end a stream early, or fail it as vLLM does (testkit/stub_faults.py);
  "stub_status": answer with this HTTP status and an OpenAI-shaped error (with "stub_retry_after": N, the
               headers `Retry-After: N` and `x-should-retry: false`, as a gateway in front of an engine sends);
  "stub_spaced": write JSON with spaces after separators (`"token_ids": [1, 2]`), as other servers do;
  "stub_plain_json": answer a `stream: true` request with one JSON body, as a server without streaming does;
  "stub_reply": answer with this text (its whitespace-separated words, one token each) instead of the
               deterministic words, e.g. a text-protocol tool call such as "CALC: 1 / 0";
  "stub_tool_arguments": the arguments text of the tool call the stub makes (with `tools`, when the last
               message says "use tool"), e.g. malformed or deeply nested JSON as a model may write it.
These are no fields of any API, so a proxy refuses them unless told to allow them: `STUB_CONTROLS`, which
testkit/processes.py `proxy_command` passes as `--allow-request-field`.
Two controls of the process, for several replicas that disagree (engine/fleet.py's checks):
  `--refuse-adapter NAME`: answer 500 to a LoRA load from a folder named NAME, as vLLM does for an adapter it
               cannot take (e.g. a rank above --max-lora-rank);
  `--logprob-shift X`: answer calls of a LoRA adapter with every logprob X higher, as a replica that loaded
               other weights under the adapter's name would.
Two controls in the model name, the one control the Responses and Messages routes pass on (they send the engine
a chat request of their own): `stub-fail-<status>-html` or `-text` (e.g. stub-fail-500-html) answers that status
with an HTML page or a plain-text line, as a gateway in front of a failing engine does; `stub-die-after-<n>`
is the base model with "stub_die_after": n.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import zlib
from collections import deque
from pathlib import Path

from aiohttp import web

from engine.adapters import LOAD_ROUTE, UNLOAD_ROUTE
from testkit import stub_pooling
from testkit.stub_answers import dumps, streamed_answer, whole_answer

STUB_CONTROLS = ("stub_delay", "stub_die_after", "stub_status", "stub_spaced", "stub_plain_json", "stub_reply",
                 "stub_tool_arguments", "stub_end_after", "stub_error_after", "stub_retry_after")  # testkit/stub_faults.py
BASE_MODEL = "stub-model"
VOCAB = ["The", "answer", "is", "42", "and", "that", "settles", "it", ".", "Sure", "here", "you", "go", "!"]


def token_id(piece: str) -> int:
    return 100 + zlib.crc32(piece.encode()) % 30000


def tokenize(text: str) -> list[int]:
    return [token_id(piece) for piece in text.split()]


EOS_ID = token_id("<|im_end|>")  # as in ChatML models: the end-of-turn token ends a completion
stub_pooling.SPELLED.update({token_id(word): word for word in [*VOCAB, "<|im_end|>"]})  # what /detokenize spells


def prompt_logprobs(ids: list[int]) -> list[dict | None]:
    """vLLM's `prompt_logprobs` (0: the prompt's own token at each position; the first has none), with a log-prob
    that depends on the token id alone: what a test of a teacher computes its gaps from (`stub_logprob`)."""
    return [None] + [{str(i): {"logprob": stub_logprob(i), "rank": 1, "decoded_token": ""}} for i in ids[1:]]


def stub_logprob(token: int) -> float:
    return -0.25 - (token % 13) / 4


def render_chat(messages: list[dict]) -> str:
    parts = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        if message.get("tool_calls"):
            content = (content or "") + " " + json.dumps(message["tool_calls"])
        parts.append(f"<|im_start|>{message.get('role')} {content or ''} <|im_end|>")
    return " ".join(parts) + " <|im_start|>assistant"


def error(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.Response(body=dumps(body), status=status, content_type="application/json")


FAILING_MODEL = re.compile(r"stub-fail-(?P<status>\d{3})-(?P<kind>html|text)")
DYING_MODEL = re.compile(r"stub-die-after-(\d+)")


def non_json_error(status: int, kind: str) -> web.Response:
    if kind == "html":
        page = f"<html><head><title>{status} Internal Server Error</title></head><body><h1>{status}</h1></body></html>"
        return web.Response(text=page, status=status, content_type="text/html")
    return web.Response(text=f"upstream failure {status}", status=status, content_type="text/plain")


class Stub:
    def __init__(self, base_model: str = BASE_MODEL, *, refuse_adapter: str | None = None,
                 logprob_shift: float = 0.0) -> None:
        self.base_model = base_model
        self.refuse_adapter = refuse_adapter
        self.logprob_shift = logprob_shift
        self.adapters: dict[str, str] = {}
        self.requests = 0
        self.last_body: dict | None = None
        # (method, path and query exactly as they arrived) of the latest requests, routed or not
        self.received: deque[tuple[str, str]] = deque(maxlen=10_000)
        # (path and query, body bytes exactly as they arrived) of the same requests, and their header names
        self.bodies: deque[tuple[str, bytes]] = deque(maxlen=1_000)
        self.header_names: deque[set[str]] = deque(maxlen=1_000)

    def known(self, model: str) -> bool:
        return model == self.base_model or model in self.adapters

    def completion_words(self, body: dict, prompt_ids: list[int]) -> list[str]:
        seed = hashlib.sha256(dumps(prompt_ids) + str(body.get("seed")).encode()).digest()
        length = 3 + seed[0] % 6
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or 16
        words = [VOCAB[(seed[i + 1]) % len(VOCAB)] for i in range(length)]
        if isinstance(body.get("stub_reply"), str):
            words = body["stub_reply"].split()
        return words[:max_tokens]

    async def models(self, request: web.Request) -> web.Response:
        now = 1_700_000_000
        base = self.base_model
        data = [{"id": base, "object": "model", "created": now, "owned_by": "vllm", "root": base, "parent": None,
                 "max_model_len": 4096}]
        data += [{"id": name, "object": "model", "created": now, "owned_by": "vllm", "root": path,
                  "parent": base, "max_model_len": 4096} for name, path in self.adapters.items()]
        return web.Response(body=dumps({"object": "list", "data": data}), content_type="application/json")

    async def load_lora(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body["lora_name"] in self.adapters and not body.get("load_inplace"):
            return error(400, f"The lora adapter '{body['lora_name']}' has already been loaded.")
        folder = Path(body["lora_path"])
        if folder.name == self.refuse_adapter:
            return error(500, f"Loading lora {body['lora_name']} failed: this engine was told to refuse {folder.name}",
                         "InternalServerError")
        if not all((folder / name).is_file() for name in ("adapter_config.json", "adapter_model.safetensors")):
            # vLLM refuses a folder without a complete PEFT adapter in the same way
            return error(400, f"Loading lora {body['lora_name']} failed: No adapter found for {folder}")
        self.adapters[body["lora_name"]] = body["lora_path"]
        return web.Response(text=f"Success: LoRA adapter '{body['lora_name']}' added successfully.")

    async def unload_lora(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.adapters.pop(body["lora_name"], None) is None:
            return error(404, f"The lora adapter '{body['lora_name']}' cannot be found.", "NotFoundError")
        return web.Response(text="Success")

    def tokenize(self, body: dict) -> dict:
        """vLLM's `/tokenize`: chat form (`messages`, rendered as the chat route does) or prompt form."""
        messages, prompt = body.get("messages"), body.get("prompt")
        if isinstance(messages, list) and all(isinstance(m, dict) for m in messages):
            ids = tokenize(render_chat(messages))
        elif isinstance(prompt, str):
            ids = tokenize(prompt)
        else:
            raise ValueError("prompt (a string) or messages (a list of message objects) is required")
        return {"count": len(ids), "max_model_len": 4096, "tokens": ids, "token_strs": None}

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=False)

    async def _body(self, request: web.Request) -> dict | None:
        """A generation request's JSON body, counted and kept as `last_body`; None when it is not JSON."""
        self.requests += 1
        try:
            body = json.loads(await request.read())
        except ValueError:
            return None
        self.last_body = body
        return body

    async def _complete(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        body = await self._body(request)
        if body is None:
            return error(400, "invalid JSON")
        if body.get("stub_status"):
            answer = error(int(body["stub_status"]), "stub error on request")
            if body.get("stub_retry_after") is not None:  # as a gateway or a rate-limited engine advises
                answer.headers.update({"Retry-After": str(body["stub_retry_after"]), "x-should-retry": "false"})
            return answer
        failing = FAILING_MODEL.fullmatch(str(body.get("model")))
        if failing:
            return non_json_error(int(failing["status"]), failing["kind"])
        dying = DYING_MODEL.fullmatch(str(body.get("model")))
        if dying:
            body = {**body, "model": self.base_model, "stub_die_after": int(dying[1])}
        if not self.known(body.get("model", "")):
            return error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        temperature = body.get("temperature", 1.0)
        if not isinstance(temperature, (int, float)):
            return error(400, "temperature must be a number")
        prompt = render_chat(body["messages"]) if chat else body["prompt"]
        if isinstance(prompt, list) and len(prompt) == 1 and not isinstance(prompt[0], int):
            prompt = prompt[0]  # a list of one prompt (of texts, or of id lists), as vLLM reads it
        prompt_ids = tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        n = body.get("n") or 1
        choices = []
        for index in range(n):
            words = self.completion_words({**body, "seed": f"{body.get('seed')}-{index}"}, prompt_ids)
            tool_call = None
            if chat and body.get("tools") and "use tool" in json.dumps(body["messages"][-1]):
                name = body["tools"][0]["function"]["name"]
                arguments = body.get("stub_tool_arguments")
                if not isinstance(arguments, str):
                    arguments = json.dumps({"expression": "6*7"})
                tool_call = {"id": f"chatcmpl-tool-{index}{len(prompt_ids)}", "type": "function",
                             "function": {"name": name, "arguments": arguments}}
                words = ["<tool_call>", json.dumps({"name": name}), "</tool_call>"]
            max_tokens = body.get("max_tokens") or 16
            stopped = len(words) < max_tokens
            ids = [token_id(w) for w in words] + ([EOS_ID] if stopped else [])
            choices.append((words, ids, tool_call, "tool_calls" if tool_call else ("stop" if stopped else "length")))
        if body.get("stream") and not body.get("stub_plain_json"):
            return await streamed_answer(request, body, chat, prompt_ids, choices, self.logprob)
        full = self._full(body, chat, prompt_ids, choices)
        raw = json.dumps(full, ensure_ascii=False).encode() if body.get("stub_spaced") else dumps(full)
        return web.Response(body=raw, content_type="application/json")

    def logprob(self, position: int, body: dict) -> float:
        """The logprob of the token at `position` of a completion (adapters: shifted by `logprob_shift`)."""
        return -0.05 * (1 + (position % 7)) + (self.logprob_shift if body.get("model") in self.adapters else 0.0)

    def _full(self, body: dict, chat: bool, prompt_ids: list[int], choices: list) -> dict:
        scores = prompt_logprobs(prompt_ids) if body.get("prompt_logprobs") is not None else None
        return whole_answer(body, chat, prompt_ids, choices, self.logprob, scores)

def require_key(api_key: str):
    """Like `vllm serve --api-key`: every /v1 route wants `Authorization: Bearer <key>`."""
    @web.middleware
    async def check(request: web.Request, handler):
        if request.path.startswith("/v1") and request.headers.get("Authorization") != f"Bearer {api_key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)
    return check


def recording(stub: Stub):
    """Keeps the raw request target of every request in `stub.received`, its body's bytes in `stub.bodies` and
    its header names in `stub.header_names`, before any routing (the handlers read the same bytes again)."""
    @web.middleware
    async def record(request: web.Request, handler):
        stub.received.append((request.method, request.raw_path))
        stub.bodies.append((request.raw_path, await request.read()))
        stub.header_names.append({name.lower() for name in request.headers})
        return await handler(request)
    return record


def build_app(base_model: str = BASE_MODEL, api_key: str | None = None, stub: Stub | None = None,
              pooling: bool = True, **controls) -> web.Application:
    """The stand-in engine's routes, answered by `stub` (default: a `Stub` serving `base_model`); without
    `pooling`, no pooling routes, as vLLM serving a generative model. `controls`: Stub's keyword arguments."""
    stub = stub or Stub(base_model, **controls)
    app = web.Application(middlewares=[recording(stub)] + ([require_key(api_key)] if api_key else []))
    app["stub"] = stub
    app.router.add_get("/v1/models", stub.models)
    app.router.add_post("/v1/chat/completions", stub.chat)
    app.router.add_post("/v1/completions", stub.completions)
    app.router.add_post(LOAD_ROUTE, stub.load_lora)  # the routes engine/adapters.py calls, as vLLM serves them
    app.router.add_post(UNLOAD_ROUTE, stub.unload_lora)
    app.router.add_get("/health", lambda r: web.Response(text="ok"))
    stub_pooling.add_routes(app, stub.tokenize, pooling)  # tokenize, pooling, score, rerank, ping, version
    return app


def arguments(default_port: int) -> argparse.ArgumentParser:
    """The command line every stand-in engine takes: where to listen."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=default_port)
    return parser


def serve(app: web.Application, host: str, port: int) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    web.run_app(app, host=host, port=port, access_log=None, print=None)


if __name__ == "__main__":
    parser = arguments(8001)
    parser.add_argument("--model", default=BASE_MODEL, help="name the base model is served under")
    parser.add_argument("--api-key", default=None, help="refuse /v1 requests without this bearer key")
    parser.add_argument("--refuse-adapter", default=None, metavar="NAME",
                        help="answer 500 to loading a LoRA adapter from a folder of this name")
    parser.add_argument("--logprob-shift", type=float, default=0.0, metavar="X",
                        help="answer LoRA adapter calls with logprobs X higher (other weights under its name)")
    args = parser.parse_args()
    serve(build_app(args.model, args.api_key, refuse_adapter=args.refuse_adapter, logprob_shift=args.logprob_shift),
          args.host, args.port)
