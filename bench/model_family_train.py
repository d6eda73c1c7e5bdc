"""One training step per model family on the engine's own samples, the adapter hot-loaded and serving, and the
lag-0 agreement between engine and trainer, on the kit's tiny random models (testkit/model_kit; random weights
are enough for all of it but learning).

    rlproxy engine --model "$(python -c 'from testkit.model_kit import build_model; print(build_model("llama3"))')" \
        --port 8612 --max-lora-rank 8 &
    .venv/bin/python bench/model_family_train.py --family llama3 --engine-url http://127.0.0.1:8612

It samples a group of completions at temperature 1 (`return_token_ids`, `logprobs`: the ids and log-probs the
proxy records), builds the trainer with LoRA on the targets found from the architecture (`target_modules
["auto"]`: trainer/lora_targets.py), scores the samples before the step (lag 0: LoRA B starts at zero, so the
engine's base and the trainer must agree), makes one step with rewards of ±1, saves the adapter, loads it into
the engine under a new name (`/v1/load_lora_adapter`), samples from it, and scores those samples with the
updated trainer: lag 0 again, now through the adapter. The bound it checks is the one bench/logprobs_modes.py
measured for the bundled model in float32 (engine and trainer within 1e-3 nats per token on average).
Appends its lines to bench/results/model_family_train.txt.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from testkit.model_kit import build_model  # noqa: E402

BOUND = 1e-3  # mean |engine - trainer| log-prob per token at lag 0, float32 on CPU


def sample(url: str, model: str, group: int, max_tokens: int, seed: int) -> list[dict]:
    messages = [{"role": "user", "content": "Name a prime number."}]
    out = []
    for index in range(group):
        body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 1.0,
                "seed": seed + index, "logprobs": True, "return_token_ids": True}
        answer = requests.post(f"{url}/v1/chat/completions", json=body, timeout=300).json()
        choice = answer["choices"][0]
        out.append({"prompt_ids": answer["prompt_token_ids"], "completion_ids": choice["token_ids"],
                    "logprobs": [entry["logprob"] for entry in choice["logprobs"]["content"]]})
    return out


def transitions(samples: list[dict]):
    from trainer.transitions import Transition

    return [Transition(prompt_ids=s["prompt_ids"], completion_ids=s["completion_ids"],
                       behaviour_logprobs=s["logprobs"], advantage=1.0 if i % 2 == 0 else -1.0)
            for i, s in enumerate(samples)]


def agreement(policy, samples: list[dict]) -> tuple[float, float]:
    """Mean and largest |engine - trainer| per token over the samples."""
    scored = policy.logprobs(transitions(samples))
    gaps = [abs(e - t) for s, row in zip(samples, scored) for e, t in zip(s["logprobs"], row)]
    return statistics.fmean(gaps), max(gaps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", required=True)
    parser.add_argument("--engine-url", required=True)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "model_family_train.txt")
    parser.add_argument("--no-adapter", metavar="WHY", help="the engine serves no adapter (gpt-oss on a CPU: vLLM "
                        "serves a mixture of experts under LoRA only with Triton): the agreement before the step and "
                        "the step only")
    args = parser.parse_args()
    from core.settings import TrainingSettings
    from trainer.ppo import PolicyTrainer

    folder = build_model(args.family)
    url = args.engine_url.rstrip("/")
    model = requests.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    base_samples = sample(url, model, args.group, args.max_tokens, seed=11)
    policy = PolicyTrainer(str(folder), TrainingSettings(seed=0, target_modules=["auto"], bf16=False))
    targets = sorted(policy.model.peft_config["default"].target_modules)
    before = agreement(policy, base_samples)
    started = time.perf_counter()
    metrics = policy.step(transitions(base_samples))
    step_s = time.perf_counter() - started
    if args.no_adapter:
        line = (f"{args.family:7} targets {','.join(targets)} | lag 0 before the step: mean {before[0]:.2e} max "
                f"{before[1]:.2e} | step {step_s:.1f} s, loss {getattr(metrics, 'loss', float('nan')):.4f} | no "
                f"adapter served: {args.no_adapter} | {'within' if before[0] <= BOUND else 'OVER'} the {BOUND:g} bound")
        print(line, flush=True)
        with args.out.open("a") as out:
            out.write(line + "\n")
        return
    name = f"{args.family}-bench-{int(time.time())}"
    with tempfile.TemporaryDirectory() as tmp:
        adapter = policy.save_adapter(Path(tmp) / name)
        loaded = requests.post(f"{url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(adapter)},
                               timeout=120)
        assert loaded.status_code == 200, loaded.text
        served = sample(url, name, args.group, args.max_tokens, seed=21)
        after = agreement(policy, served)
        base_served = sample(url, model, args.group, args.max_tokens, seed=21)  # the same seeds, no adapter
        requests.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60)
    # the step moved the served policy: the adapter's log-probs against the base's on the adapter's samples
    with_adapter, without = policy.logprobs(transitions(served)), policy.logprobs(transitions(served), adapter=False)
    moved = statistics.fmean(abs(a - b) for x, y in zip(with_adapter, without) for a, b in zip(x, y))
    differs = sum(s["completion_ids"] != b["completion_ids"] for s, b in zip(served, base_served))
    line = (f"{args.family:7} targets {','.join(targets)} | lag 0 before the step: mean {before[0]:.2e} max "
            f"{before[1]:.2e} | step {step_s:.1f} s, loss {getattr(metrics, 'loss', float('nan')):.4f} | adapter "
            f"{name} served, lag 0 through it: mean {after[0]:.2e} max {after[1]:.2e} | it moved log-probs by {moved:.2e} "
            f"a token, {differs}/{len(served)} samples differ from the base's | "
            f"{'within' if max(before[0], after[0]) <= BOUND else 'OVER'} the {BOUND:g} bound")
    print(line, flush=True)
    with args.out.open("a") as out:
        out.write(line + "\n")
    print(json.dumps({"family": args.family, "targets": targets, "before": before, "after": after}))


if __name__ == "__main__":
    main()
