"""Deterministic trainer steps: the metrics of N PPO steps on fixed transitions with a fixed seed, printed in full.

    python bench/step_losses.py                    # a tiny random Llama built here (no downloads), 4 steps
    python bench/step_losses.py --model bundled    # the bundled model
    python bench/step_losses.py --model DIR --steps 3
    python -m torch.distributed.run --standalone --nproc-per-node 2 bench/step_losses.py   # the base sharded

A change to how a step is organised (not to what it computes) must print the same numbers: run it before and
after and compare. (Decoupled PPO, issue 36, changed what a step computes: since then the ratio is taken against
the trainer's own proximal log-probs and the engine's enter as a clipped importance weight, so the numbers printed
before it differ by design; `--set proximal_policy=behaviour`-style runs of the old computation are possible with
TrainingSettings(proximal_policy="behaviour").) The batch exercises every path of a step: several mini-batches and epochs, several
micro-batches per mini-batch, the reference (KL) pass, a transition longer than the micro-batch budget
(activation checkpointing), and context tokens (loss mask 0) inside completions.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as bench/train_step.py: spinning threads stall shared cores

import torch  # noqa: E402

from core.settings import TrainingSettings  # noqa: E402
from trainer.transitions import Transition  # noqa: E402

FIELDS = ("loss", "policy_loss", "kl", "clip_fraction", "ratio_mean", "ratio_max", "behaviour_kl", "off_policy_kl",
          "is_weight_max", "is_filtered", "entropy", "grad_norm", "tokens", "trained_tokens", "micro_batches",
          "updates")


def tiny_llama() -> str:
    """A 2-layer random Llama saved to a temporary folder, the same on every run (seeded)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tempfile.mkdtemp(prefix="tiny-llama-")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def fixed_transitions(vocab: int, count: int = 12, long_prompt: int = 90) -> list[Transition]:
    """Prompts and completions of mixed lengths, one longer than the micro-batch budget, every third with
    context tokens in its completion; behaviour log-probs a little off the policy's, so ratios move."""
    g = torch.Generator().manual_seed(11)
    batch = []
    for i in range(count):
        prompt = long_prompt if i == 0 else 6 + int(torch.randint(0, 20, (), generator=g))
        completion = 3 + int(torch.randint(0, 8, (), generator=g))
        ids = torch.randint(3, vocab, (prompt + completion,), generator=g).tolist()
        mask = [0 if i % 3 == 1 and j == 1 else 1 for j in range(completion)]
        behaviour = [-6.0 + 0.1 * j if keep else 0.0 for j, keep in enumerate(mask)]
        batch.append(Transition(ids[:prompt], ids[prompt:], behaviour, advantage=(-1.0) ** i * (1 + i / 10),
                                loss_mask=mask))
    return batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="'tiny' (built here), 'bundled', or a model folder")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    from trainer import parallel
    from trainer.ppo import PolicyTrainer
    from trainer.sharding import whole

    if args.model == "tiny":
        path = tiny_llama()
    elif args.model == "bundled":
        from engine.model import default_model_path

        path = str(default_model_path())
    else:
        path = args.model
    config = TrainingSettings(bf16=False, mini_batches=2, ppo_epochs=2, micro_batch_tokens=64, learning_rate=1e-2,
                              kl_coef=0.01, seed=3)
    collective = parallel.init_from_environment() if parallel.launched_by_torchrun() else None
    trainer = PolicyTrainer(path, config, collective=collective)
    batch = fixed_transitions(trainer.model.config.vocab_size)
    say = print if collective is None or collective.rank == 0 else (lambda *_: None)
    say(f"model: {args.model} | {len(batch)} transitions | steps: {args.steps}")
    say("step " + " ".join(f"{name:>14}" for name in FIELDS))
    for _ in range(args.steps):
        metrics = trainer.step(batch).as_dict()
        say(f"{metrics['step']:>4} " + " ".join(f"{metrics[name]:>14.8g}" for name in FIELDS))
    lora = torch.cat([whole(p).detach().reshape(-1) for p in trainer.params])  # all-gathered when sharded
    say(f"LoRA parameters: sum {float(lora.sum()):.8g}, sum of squares {float((lora ** 2).sum()):.8g}")


if __name__ == "__main__":
    main()
