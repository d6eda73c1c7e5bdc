"""What the proxy costs in front of the real engine: generated tokens/s and time to first token, straight to
vLLM and through `rlproxy serve` (recording into Postgres), interleaved, at 1 and 8 concurrent streams.

    python bench/engine_passthrough.py [--engine-url http://127.0.0.1:8000] [--rounds 3] [--max-tokens 48]
Without --engine-url it starts the local engine with the bundled model (30-90 s).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from testkit.processes import free_port, proxy_command, running  # noqa: E402

PROMPTS = ["Write a short story about a lighthouse.", "Explain how rain forms.", "List some fruits and colours.",
           "Describe a busy market.", "Tell me about the moon.", "What do bees do all day?",
           "Describe a winter morning.", "How does a bicycle work?"]


async def stream_one(http: aiohttp.ClientSession, url: str, model: str, prompt: str, max_tokens: int,
                     capture_fields: bool = False):
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    if capture_fields:  # what the proxy adds upstream: separates the engine's logprob cost from the proxy's
        body.update(logprobs=True, return_token_ids=True)
    began = time.perf_counter()
    first = None
    tokens = 0
    async with http.post(url, data=orjson.dumps(body), headers={"Content-Type": "application/json"}) as response:
        async for line in response.content:
            if not line.startswith(b"data: {"):
                continue
            chunk = orjson.loads(line[6:])
            if first is None and any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or ()):
                first = time.perf_counter() - began
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return tokens, first or 0.0


async def level(url: str, model: str, concurrency: int, max_tokens: int,
                capture_fields: bool = False) -> tuple[float, float]:
    async with aiohttp.ClientSession() as http:
        began = time.perf_counter()
        results = await asyncio.gather(*(stream_one(http, url, model, PROMPTS[i % len(PROMPTS)], max_tokens,
                                                    capture_fields) for i in range(concurrency)))
        elapsed = time.perf_counter() - began
    return sum(t for t, _ in results) / elapsed, statistics.median(f for _, f in results)


async def measure(engine: str, proxy: str, model: str, rounds: int, max_tokens: int) -> list[tuple]:
    rows = []
    for concurrency in (1, 8):
        targets = (("direct", engine, False), ("direct+logprobs", engine, True), ("proxy", proxy, False))
        samples = {name: [] for name, _, _ in targets}
        for _, base, fields in targets:  # warm-up: the first request with logprobs compiles another graph
            await level(f"{base}/v1/chat/completions", model, concurrency, 4, fields)
        for _ in range(rounds):
            for name, base, fields in targets:
                samples[name].append(await level(f"{base}/v1/chat/completions", model, concurrency, max_tokens,
                                                 fields))
        tps = {name: statistics.mean(s[0] for s in samples[name]) for name in samples}
        ttft = {name: statistics.median(s[1] for s in samples[name]) * 1000 for name in samples}
        rows.append((concurrency, tps, ttft))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine-url", default=None)
    parser.add_argument("--database-url", default="postgresql+asyncpg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="rlproxy-bench-"))
    with contextlib.ExitStack() as stack:
        engine_url = args.engine_url
        if engine_url is None:
            from core.settings import EngineSettings
            from engine.local import Engine

            engine = stack.enter_context(Engine(EngineSettings(port=free_port(), max_model_len=2048, kv_cache_gib=1)))
            engine_url = engine.base_url
        model = asyncio.run(_model(engine_url))
        port = free_port()
        proxy = f"http://127.0.0.1:{port}"
        stack.enter_context(running(proxy_command(port, [engine_url], args.database_url, "--spool-path",
                                                  str(workdir / "spool.jsonl")), proxy + "/healthz",
                                    log_path=workdir / "proxy.log"))
        rows = asyncio.run(measure(engine_url, proxy, model, args.rounds, args.max_tokens))
    # proxy/direct is the whole cost of capture; proxy/direct+logprobs is the proxy's own share (the engine
    # computing the logprobs and ids it is asked for is the rest).
    print(f"{'streams':>7}{'direct tok/s':>14}{'+logprobs':>11}{'proxy tok/s':>13}{'proxy/direct':>14}"
          f"{'proxy/+logprobs':>17}{'TTFT ms direct/+lp/proxy':>27}")
    for concurrency, tps, ttft in rows:
        d, lp, p = tps["direct"], tps["direct+logprobs"], tps["proxy"]
        ttfts = "/".join(f"{ttft[name]:.0f}" for name in ("direct", "direct+logprobs", "proxy"))
        print(f"{concurrency:>7}{d:>14.1f}{lp:>11.1f}{p:>13.1f}{p / d:>14.3f}{p / lp:>17.3f}{ttfts:>27}")


async def _model(engine_url: str) -> str:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{engine_url}/v1/models") as response:
            return (await response.json())["data"][0]["id"]


if __name__ == "__main__":
    main()
