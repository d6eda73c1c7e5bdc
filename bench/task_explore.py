"""Base-model success of the demo agent on each task/prompt variant, against a real vLLM engine.

    .venv/bin/python bench/task_explore.py                       # starts an engine with the bundled model
    .venv/bin/python bench/task_explore.py --engine-url http://127.0.0.1:8000   # reuse a running engine
    .venv/bin/python bench/task_explore.py --variants calc-chat2/mul2x2,lookup-chat2/lookup --n 64

A variant is PROMPTING/FAMILY: a prompt from demo.agent.PROMPTS and a task family from demo.tasks.FAMILIES.
Each variant runs --n tasks once (temperature 1.0 unless told, --concurrency episodes at a time) and the
table shows success, mean model calls per episode, tool-use rate (a tool call got a RESULT), answer-format
rate (the episode ended with an ANSWER line), mean prompt/completion tokens per episode and wall time.
The engine shares the machine's cores with everything else running, so the seconds are indicative only.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import openai  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from demo.agent import PROMPTS, evaluate_detailed  # noqa: E402
from demo.tasks import FAMILIES, heldout_tasks, task_kind, train_tasks  # noqa: E402
from store.evaluation import wilson  # noqa: E402

DEFAULT_VARIANTS = (
    "calc-chat2/words2x2",  # the demo's choice
    "calc-chat2-strict/words2x2",
    "calc-chat1/words2x2",
    "calc-sys2/words2x2",
    "direct-chat2/words2x2",  # control: no tool
    "calc-chat2/mul2x2",
    "calc-sys2/mul2x2",
    "direct-chat2/mul2x2",  # control: no tool
    "lookup-chat2/lookup",
)


def parse_variant(text: str) -> tuple[str, str]:
    prompting, _, family = text.partition("/")
    if prompting not in PROMPTS:
        raise SystemExit(f"unknown prompt {prompting!r}; one of {sorted(PROMPTS)}")
    if family not in FAMILIES:
        raise SystemExit(f"unknown task family {family!r}; one of {sorted(FAMILIES)}")
    if PROMPTS[prompting].tool != task_kind(family):
        raise SystemExit(f"prompt {prompting} is written for {PROMPTS[prompting].tool} tasks, not {family}")
    return prompting, family


async def explore(base_url: str, model: str, args: argparse.Namespace) -> list[dict]:
    client = openai.AsyncOpenAI(base_url=base_url.rstrip("/") + "/v1", api_key="unused", max_retries=0,
                                timeout=300)
    rows = []
    console = Console(stderr=True)
    try:
        for variant in args.variants:
            prompting, family = parse_variant(variant)
            pick = heldout_tasks if args.split == "heldout" else train_tasks
            tasks = pick(args.n, args.seed, family=family) if family != "lookup" else _lookup_tasks(pick, args)
            for repeat in range(args.repeats):
                stats = await evaluate_detailed(
                    client, model, tasks, concurrency=args.concurrency, prompting=PROMPTS[prompting],
                    temperature=args.temperature, max_turns=args.max_turns, max_tokens=args.max_tokens)
                lo, hi = wilson(stats.success * stats.n, stats.n)
                row = {"variant": variant, "split": args.split, "repeat": repeat, "n": stats.n,
                       "success": stats.success, "ci95": [lo, hi], "mean_turns": stats.mean_turns,
                       "tool_use_rate": stats.tool_use_rate, "answer_format_rate": stats.answer_format_rate,
                       "errors": stats.errors, "prompt_tokens": stats.mean_prompt_tokens,
                       "completion_tokens": stats.mean_completion_tokens, "seconds": stats.seconds}
                rows.append(row)
                console.print(f"{variant}: success {stats.success:.0%} ({stats.n} tasks, {stats.seconds:.0f} s)")
                if args.show:
                    for result in stats.results[: args.show]:
                        if isinstance(result, BaseException):
                            console.print(f"  error: {result!r}")
                            continue
                        talk = [m["content"] for m in result.transcript[-2 * result.turns:]]
                        console.print(f"  r={result.reward:.0f} {talk!r}")
    finally:
        await client.close()
    return rows


def _lookup_tasks(pick, args: argparse.Namespace):
    """The lookup table is small: cycle its split when --n asks for more problems than it has."""
    from demo.tasks import pool_size

    size = pool_size(args.split, "lookup")
    tasks = pick(size, args.seed, family="lookup")
    return [tasks[i % size] for i in range(args.n)]


def print_table(rows: list[dict], title: str) -> None:
    table = Table(title=title)
    for column in ("variant", "n", "success", "95% CI", "mean turns", "tool use", "answer format",
                   "prompt tok", "compl tok", "errors", "seconds"):
        table.add_column(column, justify="left" if column == "variant" else "right")
    for row in rows:
        lo, hi = row["ci95"]
        table.add_row(row["variant"], str(row["n"]), f"{row['success']:.1%}", f"{lo:.0%}-{hi:.0%}",
                      f"{row['mean_turns']:.2f}", f"{row['tool_use_rate']:.0%}", f"{row['answer_format_rate']:.0%}",
                      f"{row['prompt_tokens']:.0f}", f"{row['completion_tokens']:.0f}", str(row["errors"]),
                      f"{row['seconds']:.0f}")
    Console(width=160).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine-url", help="base URL (no /v1) of a running engine; default: start one")
    parser.add_argument("--model", help="model name to request (default: the engine's first served model)")
    parser.add_argument("--port", type=int, default=8031, help="port for the engine this script starts")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                        help="comma-separated PROMPTING/FAMILY list")
    parser.add_argument("--n", type=int, default=64, help="tasks per variant")
    parser.add_argument("--repeats", type=int, default=1, help="runs per variant (same tasks, fresh samples)")
    parser.add_argument("--split", choices=("train", "heldout"), default="heldout")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-turns", type=int, default=None,
                        help="model calls per episode (default: the prompt variant's own: 3, chain 4)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--show", type=int, default=0, help="print this many transcripts per variant")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for variant in args.variants:
        parse_variant(variant)

    began = time.perf_counter()
    if args.engine_url:
        model = args.model or _served_model(args.engine_url)
        rows = asyncio.run(explore(args.engine_url, model, args))
    else:
        from core.settings import EngineSettings
        from engine.local import Engine
        from engine.model import prepare_model

        settings = EngineSettings(port=args.port, max_model_len=2048, kv_cache_gib=1)
        with Engine(settings, model_path=prepare_model()) as engine:
            rows = asyncio.run(explore(engine.base_url, args.model or engine.served_model_name, args))
    title = (f"base success, {args.split} split, temperature {args.temperature}, "
             f"max_turns {args.max_turns}, max_tokens {args.max_tokens} ({time.perf_counter() - began:.0f} s)")
    print_table(rows, title)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


def _served_model(base_url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(base_url.rstrip("/") + "/v1/models", timeout=10) as response:
        return json.loads(response.read())["data"][0]["id"]


if __name__ == "__main__":
    main()
