"""Trainer throughput vs a bare peft forward/backward on the same tokens.

    python bench/train_step.py                 # the bundled model (prepared on first use), else a tiny one
    python bench/train_step.py --model DIR     # any Hugging Face causal-LM folder

Both run on the same peft model, the same micro-batches and the same autocast; the baseline's loss is
plain token cross-entropy on the trained tokens. Steps alternate (trainer, baseline, trainer, ...) so
load from other processes hits both alike; medians of wall and CPU time are reported. The trainer's
extra work is the PPO/KL arithmetic, the entropy metric and, when kl_coef > 0, the reference forward
pass; it saves the LM head on prompt positions.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# Spinning OpenMP workers stall each other badly when the cores are shared (e.g. with vLLM); must be set
# before torch loads its OpenMP runtime.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from core.settings import TrainingSettings  # noqa: E402
from trainer.ppo import PolicyTrainer, collate  # noqa: E402
from trainer.transitions import Transition, pack_micro_batches  # noqa: E402


def resolve_model(arg: str | None) -> tuple[str, str]:
    if arg:
        return arg, "given"
    try:
        from engine.model import default_model_path

        return str(default_model_path()), "bundled"
    except Exception as exc:  # not prepared / not installed: fall back so the bench still runs
        print(f"bundled model unavailable ({type(exc).__name__}: {exc}); using a tiny random model")
        from transformers import LlamaConfig, LlamaForCausalLM

        path = tempfile.mkdtemp(prefix="tiny-llama-")
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2)
        LlamaForCausalLM(config).save_pretrained(path)
        return path, "tiny"


def synthetic_transitions(
    n: int, prompt_len: int, completion_len: int, vocab: int, seed: int
) -> list[Transition]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p = int(prompt_len * (0.5 + torch.rand((), generator=g)))  # lengths vary like real traffic
        c = int(completion_len * (0.5 + torch.rand((), generator=g)))
        out.append(Transition(
            prompt_ids=torch.randint(0, vocab, (p,), generator=g).tolist(),
            completion_ids=torch.randint(0, vocab, (c,), generator=g).tolist(),
            behaviour_logprobs=[0.0] * c,
            advantage=1.0 if i % 2 else -1.0,
        ))
    return out


def timed(fn, *args) -> tuple[float, float, object]:
    """(wall seconds, CPU seconds of this process, result). CPU time barely moves when other processes
    share the cores, so it is the fairer comparison on a busy machine."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn(*args)
    return time.perf_counter() - wall, time.process_time() - cpu, result


def baseline_step(trainer: PolicyTrainer, batch: list[Transition], optimizer: torch.optim.Optimizer) -> None:
    """Cross-entropy on the trained tokens with the peft model directly: the floor for any trainer."""
    micro = [collate(mb) for mb in pack_micro_batches(batch, trainer.config.micro_batch_tokens)]
    total = sum(float(mb.loss_mask.sum()) for mb in micro)
    for mb in micro:
        labels = torch.full_like(mb.input_ids, -100)
        labels[:, mb.start + 1:] = mb.input_ids[:, mb.start + 1:].masked_fill(mb.loss_mask == 0, -100)
        with trainer._autocast():
            out = trainer.model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, labels=labels)
        (out.loss * float(mb.loss_mask.sum()) / total).backward()
    torch.nn.utils.clip_grad_norm_(trainer.params, trainer.config.max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="Hugging Face model folder (default: the bundled model)")
    ap.add_argument("--transitions", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=192)
    ap.add_argument("--completion-len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4, help="measured steps per mode (after one warm-up)")
    ap.add_argument("--kl-coef", type=float, default=None, help="default: the training settings'")
    ap.add_argument("--no-bf16", action="store_true")
    ap.add_argument("--lora-layers", type=int, default=None, help="default: the training settings' (0: all layers)")
    ap.add_argument("--micro-batch-tokens", type=int, default=None)
    args = ap.parse_args()

    path, source = resolve_model(args.model)
    overrides = {"bf16": not args.no_bf16}
    if args.kl_coef is not None:
        overrides["kl_coef"] = args.kl_coef
    if args.micro_batch_tokens:
        overrides["micro_batch_tokens"] = args.micro_batch_tokens
    if args.lora_layers is not None:
        overrides["lora_layers"] = args.lora_layers
    config = TrainingSettings(**overrides)
    trainer = PolicyTrainer(path, config)
    vocab = trainer.model.config.vocab_size
    batch = synthetic_transitions(args.transitions, args.prompt_len, args.completion_len, vocab, config.seed)
    for t, lp in zip(batch, trainer.logprobs(batch)):  # on-policy behaviour log-probs, as from vLLM
        t.behaviour_logprobs = lp
    baseline_opt = torch.optim.AdamW(trainer.params, lr=config.learning_rate)

    trainer.step(batch), baseline_step(trainer, batch, baseline_opt)  # warm-up (allocator, oneDNN kernels)
    runs: dict[str, list[tuple[float, float]]] = {"trainer": [], "peft": []}
    metrics = None
    for _ in range(args.steps):  # alternate, so load from other processes hits both alike
        wall, cpu, metrics = timed(trainer.step, batch)
        runs["trainer"].append((wall, cpu))
        wall, cpu, _ = timed(baseline_step, trainer, batch, baseline_opt)
        runs["peft"].append((wall, cpu))

    tokens = metrics.tokens
    print(f"model: {source} {path} | {torch.get_num_threads()} threads "
          f"| bf16 autocast {trainer.autocast_enabled} "
          f"| kl_coef {config.kl_coef} | lora r{config.lora_rank} {','.join(config.target_modules)} "
          f"on {'the top ' + str(config.lora_layers) if config.lora_layers else 'all'} layers")
    print(f"batch: {len(batch)} transitions, {tokens} tokens ({metrics.trained_tokens} trained), "
          f"{metrics.micro_batches} micro-batches of <= {config.micro_batch_tokens} padded tokens, "
          f"{args.steps} steps each, load average {os.getloadavg()[0]:.1f}")
    print(f"{'mode':<9}{'wall s/step':>12}{'min':>7}{'max':>7}{'tokens/s':>10}{'CPU s/step':>12}")
    med = {}
    for name, times in runs.items():
        walls, cpus = [w for w, _ in times], [c for _, c in times]
        med[name] = (statistics.median(walls), statistics.median(cpus))
        print(f"{name:<9}{med[name][0]:>12.2f}{min(walls):>7.2f}{max(walls):>7.2f}"
              f"{tokens / med[name][0]:>10.0f}{med[name][1]:>12.2f}")
    wall_ratio, cpu_ratio = med["trainer"][0] / med["peft"][0], med["trainer"][1] / med["peft"][1]
    print(f"trainer / peft: wall {wall_ratio:.2f}, CPU {cpu_ratio:.2f} (target <= 1.20)")

if __name__ == "__main__":
    main()
