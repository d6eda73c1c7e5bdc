"""One PPO step on a fixed synthetic batch, run under torchrun (every rank) or alone; the adapter is saved.

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/parallel_step.py MODEL OUT
    python tests/parallel_step.py MODEL OUT
"""
from __future__ import annotations

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
    """Prompts and completions of different lengths, half rewarded above the mean and half below."""
    rng = random.Random(7)
    batch = []
    for i in range(count):
        prompt = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(6, 20))]
        completion = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(2, 9))]
        batch.append(Transition(prompt, completion, [-6.0] * len(completion), advantage=1.0 if i % 2 else -1.0))
    return batch


def main(model: str, out: str) -> None:
    collective = parallel.init_from_environment() if parallel.launched_by_torchrun() else None
    config = TrainingSettings(bf16=False, mini_batches=2, ppo_epochs=2, micro_batch_tokens=64, learning_rate=1e-2,
                         kl_coef=0.01)
    policy = PolicyTrainer(model, config, collective=collective)
    metrics = policy.step(synthetic_batch())
    if collective is None or collective.rank == 0:
        policy.save_adapter(out)
        (Path(out) / "metrics.json").write_text(json.dumps(metrics.as_dict()))


if __name__ == "__main__":
    main(*sys.argv[1:3])
