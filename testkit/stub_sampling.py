"""The stand-in engine refusing sampling parameters as vLLM 0.32 does, word for word (vllm/sampling_params.py
`_verify_args` and `_verify_greedy_sampling`: a 400 the proxy relays in the agent's route's format):

    with engine_in_thread(SamplingStub()) as engine_url: ...

The plain Stub samples whatever it is asked; tests of what the proxy does with a request the engine refuses use
this one."""
from __future__ import annotations

import json

from aiohttp import web

from testkit.stub_engine import Stub, dumps


def sampling_refused(body: dict) -> tuple[str, str | None] | None:
    """vLLM's message refusing the body's temperature, top_p, top_k or n and the `param` it names, or None when it
    samples them (the messages as vLLM 0.32 answered them, tests/test_rollout_sampling_engine.py)."""
    temperature, top_p, top_k, n = body.get("temperature"), body.get("top_p"), body.get("top_k"), body.get("n") or 1
    if isinstance(temperature, (int, float)) and temperature < 0:
        return _named(f"temperature must be non-negative, got {float(temperature)}.", "temperature", temperature)
    if isinstance(temperature, (int, float)) and temperature > 2:
        return _named(f"temperature must be in [0, 2], got {float(temperature)}.", "temperature", temperature)
    if isinstance(top_p, (int, float)) and not 0.0 < top_p <= 1.0:
        return _named(f"top_p must be in (0, 1], got {float(top_p)}.", "top_p", top_p)
    if isinstance(top_k, int) and top_k < -1:
        return f"top_k must be 0 (disable), or at least 1, got {top_k}.", None
    if temperature == 0 and n > 1:
        return f"n must be 1 when using greedy sampling, got {n}.", None
    return None


def _named(message: str, param: str, value: float) -> tuple[str, str]:
    return f"{message} (parameter={param}, value={float(value)})", param


class SamplingStub(Stub):
    """A Stub whose chat and completions routes refuse what vLLM refuses of the sampling parameters."""

    async def _complete(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        try:
            body = json.loads(await request.read())
        except ValueError:
            body = None
        if isinstance(body, dict) and (refused := sampling_refused(body)) is not None:
            self.requests += 1
            self.last_body = body
            message, param = refused
            return web.Response(body=dumps({"error": {"message": message, "type": "BadRequestError", "param": param,
                                                      "code": 400}}), status=400, content_type="application/json")
        return await super()._complete(request, chat=chat)
