"""bench/gpu_check.py's agreement part: a small Qwen3-shaped model initialised from a fixed seed, scored by
`PolicyTrainer.logprobs` on the CPU in float32 (the reference; a child process with CUDA hidden), on the CPU with
bfloat16 where it is fast, and on CUDA in float32 and bfloat16 where there is one; one line per comparison.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from gpu_shapes import CHECK, RESULT, ROOT, child_env, fixed_batch, save_random_model

AGREEMENT_SHAPE = dict(hidden=256, intermediate=768, layers=4, heads=4, kv_heads=2, head_dim=64, tied=True, vocab=32768)


def score(args: argparse.Namespace) -> None:
    """(child) Per-token log-probs of the fixed batch under the seeded model, on whatever device this process sees."""
    import torch

    from core.settings import TrainingSettings
    from trainer.ppo import PolicyTrainer

    policy = PolicyTrainer(args.model, TrainingSettings(bf16=args.bf16, seed=0))
    batch = fixed_batch(AGREEMENT_SHAPE["vocab"], 4, 192, 64, seed=1)
    scores = policy.logprobs(batch, adapter=False)  # LoRA B starts at zero: the base model's log-probs
    print(RESULT + json.dumps({"device": str(policy.device), "autocast": policy.autocast_enabled,
                               "torch": torch.__version__, "logprobs": scores}), flush=True)


def scored(model: Path, bf16: bool, cpu: bool, timeout: float) -> dict:
    env = child_env(**({"CUDA_VISIBLE_DEVICES": ""} if cpu else {}))
    command = [sys.executable, str(CHECK), "score", "--model", str(model)] + (["--bf16"] if bf16 else [])
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"scoring failed (exit {done.returncode}): {done.stderr[-1500:]}")
    return json.loads(lines[-1][len(RESULT):])


def agreement(workdir: str | None, timeout: float) -> Iterator[str]:
    """Lines, one per comparison as it is computed; a comparison that fails is a line with its error."""
    import torch

    with tempfile.TemporaryDirectory(dir=workdir) as folder:
        save_random_model(AGREEMENT_SHAPE, Path(folder), "cpu", "float32", seed=1234)
        reference = scored(Path(folder), bf16=False, cpu=True, timeout=timeout)
        flat = [x for row in reference["logprobs"] for x in row]
        yield (f"reference: cpu float32 (torch {reference['torch']}), {len(flat)} completion tokens, mean log-prob "
               f"{statistics.fmean(flat):.4f}")
        others = [("cpu, bfloat16 where fast", True, True)]
        if torch.cuda.is_available():
            others += [("cuda, float32", False, False), ("cuda, bfloat16", True, False)]
        for label, bf16, cpu in others:
            try:
                other = scored(Path(folder), bf16=bf16, cpu=cpu, timeout=timeout)
            except Exception as error:
                yield f"{label:<26} failed: {type(error).__name__}: {error}"[:1500]
                continue
            diffs = [abs(a - b) for ra, rb in zip(reference["logprobs"], other["logprobs"]) for a, b in zip(ra, rb)]
            yield (f"{label:<26} (computed in {'bfloat16' if other['autocast'] else 'float32'} on "
                   f"{other['device']}): mean |diff| {statistics.fmean(diffs):.2e}, max |diff| {max(diffs):.2e}")
    if not torch.cuda.is_available():
        yield "cuda: not available here; only the CPU rows were computed"
