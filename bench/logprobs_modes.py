"""What vLLM's two log-prob modes return for each sampling field the proxy names, and how closely the trainer's
own log-probs of the same tokens agree with them (docs/vllm-wire-format.md section 12, docs/learning.md).

    python bench/logprobs_modes.py --raw http://127.0.0.1:8900 --processed http://127.0.0.1:8901

Two engines of the same model and dtype, one started with vLLM's default `--logprobs-mode raw_logprobs`, one
with `processed_logprobs` (`rlproxy engine --engine-arg=--logprobs-mode --engine-arg=processed_logprobs`). Each
setting is sent to both with the same prompts and seed; the sampled tokens are then scored by the trainer's
own code (trainer/logprobs.py `token_scores`, the bundled model in float32 as the engine serves it) twice: at
temperature 1 over the whole vocabulary (the raw distribution), and as the call was sampled (the temperature,
top_p and top_k that `calls.sampling` records for it; anything else it cannot rebuild is scored raw). Per
setting and mode: the mean |engine - trainer| per token against each, and agreement_kl (the k3 estimate the
trainer's served-agreement check uses) against the as-sampled scores: what lag-0 agreement a step would report.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import requests  # noqa: E402
import torch  # noqa: E402

from core.sampling_rules import parse_sampled  # noqa: E402
from proxy.capture import altered_sampling  # noqa: E402
from trainer.logprobs import token_scores  # noqa: E402

PROMPTS = ["Write a short poem about the sea.", "List three uses of a paperclip.",
           "Explain what a prime number is.", "Tell me a fact about Mars."]
TOOL = {"type": "function", "function": {"name": "add", "description": "Add two numbers",
                                         "parameters": {"type": "object", "properties": {
                                             "a": {"type": "number"}, "b": {"type": "number"}},
                                             "required": ["a", "b"]}}}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {
    "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}}
SETTINGS: list[tuple[str, dict]] = [
    ("none (temperature 1)", {}),
    ("temperature 0.3", {"temperature": 0.3}),
    ("temperature 0.7", {"temperature": 0.7}),
    ("temperature 1.3", {"temperature": 1.3}),
    ("top_p 0.9", {"top_p": 0.9}),
    ("top_k 20", {"top_k": 20}),
    ("temperature 0.7, top_p 0.95", {"temperature": 0.7, "top_p": 0.95}),
    ("temperature 0.6, top_p 0.95, top_k 20", {"temperature": 0.6, "top_p": 0.95, "top_k": 20}),
    ("min_p 0.1", {"min_p": 0.1}),
    ("presence_penalty 1.5", {"presence_penalty": 1.5}),
    ("frequency_penalty 1.5", {"frequency_penalty": 1.5}),
    ("repetition_penalty 1.3", {"repetition_penalty": 1.3}),
    ("logit_bias +5 on 10 tokens", {"logit_bias": {str(t): 5 for t in range(28, 38)}}),
    ("response_format json_schema", {"response_format": SCHEMA}),
    ("tool_choice required", {"tools": [TOOL], "tool_choice": "required"}),
    ("thinking_token_budget 8", {"thinking_token_budget": 8}),
]


def sample(url: str, model: str, prompt: str, fields: dict, seed: int) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 40, "seed": seed,
            "logprobs": True, "return_token_ids": True, **fields}
    answer = requests.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    if answer.status_code != 200:
        return {"error": f"{answer.status_code} {answer.text[:120]}"}
    data = answer.json()
    choice = data["choices"][0]
    return {"prompt": data["prompt_token_ids"], "tokens": choice["token_ids"],
            "logprobs": [c["logprob"] for c in choice["logprobs"]["content"]]}


def trainer_scores(model, prompt: list[int], tokens: list[int], sampled) -> torch.Tensor:
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        hidden = model.model(input_ids=ids).last_hidden_state[0, len(prompt) - 1: -1]
        n = len(tokens)
        kwargs = {}
        if sampled is not None and not sampled.neutral:
            kwargs = {"temperature": torch.full((n,), sampled.temperature),
                      "top_p": torch.full((n,), sampled.top_p), "top_k": torch.full((n,), sampled.top_k)}
        return token_scores(hidden, model.get_output_embeddings(), torch.tensor(tokens), **kwargs).logprobs


def compare(engine: list[float], trainer: torch.Tensor) -> tuple[float, float]:
    """(mean |engine - trainer|, k3 KL(engine || trainer)) over tokens with a finite engine log-prob."""
    e = torch.tensor([x if x is not None else float("nan") for x in engine])
    keep = e.isfinite() & trainer.isfinite()
    log_r = trainer[keep] - e[keep]
    return float(log_r.abs().mean()), float((log_r.exp() - 1 - log_r).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--raw", default="http://127.0.0.1:8900", help="engine with --logprobs-mode raw_logprobs")
    parser.add_argument("--processed", default="http://127.0.0.1:8901", help="engine with processed_logprobs")
    parser.add_argument("--model-dir", type=Path, default=None, help="the served model's folder (default: its root)")
    parser.add_argument("--only", action="append", default=[],
                        help="measure only the settings whose label starts with this (repeat)")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    listed = requests.get(f"{args.raw}/v1/models", timeout=30).json()["data"][0]
    name, folder = listed["id"], args.model_dir or Path(listed["root"])
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    torch.set_num_threads(1)
    print("| setting | calls.sampling | mode | tokens | mean abs vs raw T=1 | mean abs vs as sampled | "
          "agreement_kl vs as sampled | note |")
    print("|---|---|---|---|---|---|---|---|")
    for label, fields in SETTINGS:
        if args.only and not label.startswith(tuple(args.only)):
            continue
        recorded = altered_sampling(fields)
        sampled = parse_sampled(recorded)
        for mode, url in (("raw", args.raw), ("processed", args.processed)):
            raw_abs, as_abs, as_kl, tokens, notes = [], [], [], 0, set()
            for seed, prompt in enumerate(PROMPTS):
                got = sample(url, name, prompt, fields, seed)
                if "error" in got:
                    notes.add(got["error"].replace("|", "/").replace("\n", " "))
                    continue
                if not got["tokens"]:
                    continue
                n = len(got["tokens"])
                raw = trainer_scores(model, got["prompt"], got["tokens"], None)
                mine = trainer_scores(model, got["prompt"], got["tokens"], sampled) if sampled else raw
                a, _ = compare(got["logprobs"], raw)
                b, k = compare(got["logprobs"], mine)
                raw_abs.append(a * n)
                as_abs.append(b * n)
                as_kl.append(k * n)
                tokens += n
                if any(x is None or x == float("-inf") for x in got["logprobs"]):
                    notes.add("some log-probs -inf")
            if tokens:
                print(f"| {label} | {recorded or ''} | {mode} | {tokens} | {sum(raw_abs) / tokens:.4f} | "
                      f"{sum(as_abs) / tokens:.4f} | {sum(as_kl) / tokens:.5f} | {'; '.join(sorted(notes))} |",
                      flush=True)
            else:
                print(f"| {label} | {recorded or ''} | {mode} | 0 | | | | {'; '.join(sorted(notes))} |", flush=True)
    print(json.dumps({"model": name, "prompts": len(PROMPTS), "max_tokens": 40}))


if __name__ == "__main__":
    main()
