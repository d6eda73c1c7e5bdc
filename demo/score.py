"""The demo's evaluation as an evaluation command, the shape every user's own script has (docs/gates.md):

    python -m demo.score --base-url URL --model NAME --split gate|heldout [--tasks 48] [--seed 0]

runs one episode of the demo agent per task of that split of the demo task family and prints one JSON line,
`{"score": success, "n": tasks, "split": …, "ci95": [low, high], "errors": k}`. `rlproxy train --gate heldout`
is `--gate command` with `command()`: its candidates are decided on the gate split, never on the held-out
tasks the demo and `rlproxy eval` report.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os

from core.settings import PLACEHOLDER_KEY
from core.settings.train import demo_score_command
from demo.evaluate import evaluate_heldout
from demo.tasks import SPLITS

SCORED_SPLITS = ("gate", "heldout")


command = demo_score_command  # the evaluation-command template that runs this module (kept with the settings)


async def score(base_url: str, model: str, split: str, tasks: int, seed: int, concurrency: int,
                api_key: str) -> dict:
    chosen = SPLITS[split](tasks, seed=seed)
    result = await evaluate_heldout(base_url, model, chosen, concurrency=concurrency, api_key=api_key)
    if result.errors == result.tasks:  # a measurement of the connection, not of the policy
        raise SystemExit(f"every episode failed ({model} at {base_url}): {result.first_error}")
    return {"score": result.success, "n": result.tasks, "split": split, "ci95": [result.low, result.high],
            "errors": result.errors, "seconds": round(result.seconds, 2)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m demo.score", description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True, help="OpenAI-compatible base URL ending in /v1.")
    parser.add_argument("--model", required=True, help="Model name to ask for (an adapter's or the base model's).")
    parser.add_argument("--split", choices=SCORED_SPLITS, default="heldout",
                        help="gate: what gates decide on; heldout: what is reported.")
    parser.add_argument("--tasks", type=int, default=48, help="Tasks, one episode each.")
    parser.add_argument("--seed", type=int, default=0, help="Which tasks (the same seed gives the same tasks).")
    parser.add_argument("--concurrency", type=int, default=8, help="Episodes in flight.")
    parser.add_argument("--api-key", default=None, help=f"Bearer key (default: $OPENAI_API_KEY or {PLACEHOLDER_KEY!r}).")
    args = parser.parse_args(argv)
    key = args.api_key or os.environ.get("OPENAI_API_KEY") or PLACEHOLDER_KEY
    print(json.dumps(asyncio.run(score(args.base_url, args.model, args.split, args.tasks, args.seed,
                                       args.concurrency, key))), flush=True)


if __name__ == "__main__":
    main()
