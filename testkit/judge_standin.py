"""A stand-in for the LLM judge (docs/judge.md), for tests and benchmarks: an OpenAI-compatible server whose
"judgement" is a hidden rubric — a trajectory scores 1.0 when its final assistant turn contains `--marker`
(or, with `--pattern`, is all matched by that regular expression; or `--rubric module:function` scores the whole
trajectory text), else 0.0 — answered in the judge's JSON contract. It can misbehave, to exercise the trainer's
retries: a reply in prose, one score short, a score out of range, or (`not-json`) a 200 whose body is no JSON.

Run it: `python -m testkit.judge_standin --port 8002 --marker SOLVED [--bad 2 --bad-kind prose]`

    GET  /v1/models             lists the judge model (after the LoRA adapters named by `--adapter`, as vLLM
                                lists an adapter with `parent` naming the model it adapts)
    POST /v1/chat/completions   scores the <trajectory id="..."> blocks of the last user message
    GET  /stats                 {"requests": n, "trajectories": [ids of the last request]}
"""
from __future__ import annotations

import argparse
import importlib
import json
import re
from collections.abc import Callable

from aiohttp import web

MODEL = "judge-standin"
BLOCK = re.compile(r'<trajectory id="([^"]+)">\n(.*?)\n</trajectory>', re.DOTALL)
BAD_KINDS = ("prose", "count", "range", "not-json")


def hidden_scores(prompt: str, marker: str | None, pattern: re.Pattern | None = None,
                  rubric: Callable[[str], float] | None = None) -> list[dict]:
    """The stand-in's verdict: 1.0 when the trajectory's last assistant turn contains the marker (or is all
    matched by the pattern, or the rubric function says so)."""
    scores = []
    for key, text in BLOCK.findall(prompt):
        final = text.rsplit("[assistant]", 1)[1] if "[assistant]" in text else ""
        if rubric is not None:
            solved = rubric(text) >= 1.0
        else:
            solved = bool(pattern.fullmatch(final.strip())) if pattern is not None else marker in final
        scores.append({"id": key, "score": 1.0 if solved else 0.0,
                       "explanation": "the final answer meets the rubric" if solved else "it does not"})
    return scores


def bad_reply(scores: list[dict], kind: str) -> str:
    """A reply that breaks the contract in one way: prose, one score short, or a score out of [0, 1]."""
    if kind == "prose":
        return "All of these trajectories look reasonable to me."
    if kind == "count":
        return json.dumps({"scores": scores[:-1]})
    return json.dumps({"scores": [{**s, "score": 1.5} for s in scores]})


def build_app(marker: str | None, bad: int, bad_kind: str, pattern: str | None = None,
              rubric: str | None = None, adapters: tuple[str, ...] = ()) -> web.Application:
    """`bad`: how many requests get a broken reply before the good ones (-1: every one)."""
    compiled = re.compile(pattern) if pattern else None
    scorer = None
    if rubric:
        module, _, function = rubric.partition(":")
        scorer = getattr(importlib.import_module(module), function)
    stats: dict = {"requests": 0, "trajectories": []}

    async def models(request: web.Request) -> web.Response:
        listed = [{"id": name, "object": "model", "root": name, "parent": MODEL} for name in adapters]
        return web.json_response({"object": "list", "data": [*listed, {"id": MODEL, "object": "model"}]})

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        prompt = next((m["content"] for m in reversed(body["messages"]) if m["role"] == "user"), "")
        scores = hidden_scores(prompt, marker, compiled, scorer)
        stats["requests"] += 1
        stats["trajectories"] = [s["id"] for s in scores]
        broken = bad < 0 or stats["requests"] <= bad
        if broken and bad_kind == "not-json":  # a 200 whose body is no JSON at all, as a gateway's error page
            return web.Response(text="<html><body>Service warming up</body></html>", content_type="text/html")
        content = bad_reply(scores, bad_kind) if broken else "```json\n" + json.dumps({"scores": scores}) + "\n```"
        return web.json_response({
            "id": f"judge-{stats['requests']}", "object": "chat.completion", "model": body.get("model", MODEL),
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
        })

    async def stats_view(request: web.Request) -> web.Response:
        return web.json_response(stats)

    app = web.Application()
    app.add_routes([web.get("/v1/models", models), web.post("/v1/chat/completions", chat),
                    web.get("/stats", stats_view)])
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8002)
    rubric = parser.add_mutually_exclusive_group(required=True)
    rubric.add_argument("--marker", help="text a final answer must contain to score 1.0")
    rubric.add_argument("--pattern", help="a regular expression the whole final answer must match for 1.0")
    rubric.add_argument("--rubric", help="module:function given a trajectory's text, returning its score")
    parser.add_argument("--bad", type=int, default=0, help="broken replies before good ones (-1: always)")
    parser.add_argument("--bad-kind", choices=BAD_KINDS, default="prose")
    parser.add_argument("--adapter", action="append", default=[], help="a LoRA adapter listed before the model")
    args = parser.parse_args()
    app = build_app(args.marker, args.bad, args.bad_kind, args.pattern, args.rubric, tuple(args.adapter))
    web.run_app(app, host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
