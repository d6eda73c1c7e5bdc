"""PPO steps on a fixed synthetic batch, run under torchrun (every rank; the base sharded) or alone; after each step
the adapter is saved to OUT/step-N and the step's metrics to OUT/metrics-N.json (rank 0); what each rank holds
to OUT/rank-R.json.

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/parallel_step.py MODEL OUT
    python tests/parallel_step.py MODEL OUT [--steps N] [--resume ADAPTER] [--bf16]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer import parallel  # noqa: E402
from core.settings import TrainingSettings  # noqa: E402
from trainer.ppo import PolicyTrainer  # noqa: E402
from trainer.transitions import Transition  # noqa: E402

VOCAB = 512


def synthetic_batch(count: int = 12) -> list[Transition]:
    """Prompts and completions of different lengths, half rewarded above the mean and half below; the first one
    longer than the micro-batch budget (so one rank checkpoints it and the other does not)."""
    rng = random.Random(7)
    batch = []
    for i in range(count):
        prompt = [rng.randrange(3, VOCAB) for _ in range(70 if i == 0 else rng.randrange(6, 20))]
        completion = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(2, 9))]
        batch.append(Transition(prompt, completion, [-6.0] * len(completion), advantage=1.0 if i % 2 else -1.0))
    return batch


def held(policy: PolicyTrainer) -> dict[str, int]:
    """Parameter elements this rank stores (its shards) and the model's whole count."""
    from torch.distributed.tensor import DTensor

    params = list(policy.model.parameters())
    return {"local": sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in params),
            "whole": sum(p.numel() for p in params)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--resume", help="an adapter folder to start from (with its optimizer state)")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 where the machine has it fast")
    parser.add_argument("--mesh", default="auto", help="how the ranks hold the base (the trainer's mesh setting)")
    args = parser.parse_args()
    collective = parallel.init_from_environment() if parallel.launched_by_torchrun() else None
    config = TrainingSettings(bf16=args.bf16, mini_batches=2, ppo_epochs=2, micro_batch_tokens=64, learning_rate=1e-2,
                         kl_coef=0.01, mesh=args.mesh)
    policy = PolicyTrainer(args.model, config, adapter_dir=args.resume, collective=collective)
    rank = collective.rank if collective else 0
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank-{rank}.json").write_text(json.dumps(held(policy)))
    batch = synthetic_batch()
    for step in range(1, args.steps + 1):
        metrics = policy.step(batch).as_dict()
        metrics["logprobs"] = policy.logprobs(batch[:3])  # every rank scores them (each pass gathers the shards)
        policy.save_adapter(args.out / f"step-{step}")  # every rank hands over its shards; rank 0 writes
        if rank == 0:
            (args.out / f"metrics-{step}.json").write_text(json.dumps(metrics))


if __name__ == "__main__":
    main()
