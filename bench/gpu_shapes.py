"""bench/gpu_check.py's shapes: random models shaped like Qwen3 0.6B-8B (and a tiny one for CI), one trainer step's
model and hardware FLOPs, docs/scale.md's per-GPU prediction for a shape, and the measurement of one shape inside its
torchrun rank (`measure`, run as `python bench/gpu_check.py measure --shape ...`), printed as one RESULT line.

Imports only the standard library at module level; torch, transformers and the trainer inside the functions, after
bench/gpu_check.py has put the carried packages and the settings without pydantic in place.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "bench" / "gpu_check.py"  # what the child processes run (it sets up their imports first)
RESULT = "RESULT "
GB = 1e9
# Published Qwen3 configurations (config.json): hidden, intermediate, layers, heads, kv heads, head dim, tied LM head.
SHAPES = {
    "qwen3-0.6b": dict(hidden=1024, intermediate=3072, layers=28, heads=16, kv_heads=8, head_dim=128, tied=True),
    "qwen3-1.7b": dict(hidden=2048, intermediate=6144, layers=28, heads=16, kv_heads=8, head_dim=128, tied=True),
    "qwen3-4b": dict(hidden=2560, intermediate=9728, layers=36, heads=32, kv_heads=8, head_dim=128, tied=True),
    "qwen3-8b": dict(hidden=4096, intermediate=12288, layers=36, heads=32, kv_heads=8, head_dim=128, tied=False),
    # CPU-sized, for CI: the same code path in seconds.
    "tiny": dict(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, head_dim=16, tied=True, vocab=512),
}
QWEN3_VOCAB = 151936
# Dense bfloat16 tensor-core peaks (no sparsity), by a substring of torch.cuda.get_device_name().
PEAK_BF16 = {"H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12, "GH200": 989e12, "A100": 312e12, "L40S": 362e12,
             "B200": 2250e12}


# --- a model of a given shape, with random weights ---------------------------------------------------------------
def model_config(shape: dict):
    import transformers

    kwargs = dict(vocab_size=shape.get("vocab", QWEN3_VOCAB), hidden_size=shape["hidden"],
                  intermediate_size=shape["intermediate"], num_hidden_layers=shape["layers"],
                  num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
                  head_dim=shape["head_dim"], tie_word_embeddings=shape["tied"], max_position_embeddings=40960)
    # Qwen3 where this transformers has it; Llama has the same projections (no q/k norm) for an older one.
    config_class = getattr(transformers, "Qwen3Config", None) or transformers.LlamaConfig
    return config_class(**kwargs)


def save_random_model(shape: dict, folder: Path, device: str, dtype: str, seed: int = 0) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    # Initialised where it is fast (on the GPU an 8B model takes seconds) and in its dtype from the start; the
    # default dtype rather than a keyword, which transformers renamed (torch_dtype -> dtype) between versions.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(model_config(shape))
    finally:
        torch.set_default_dtype(previous)
    model.save_pretrained(folder, max_shard_size="50GB")
    del model
    if device == "cuda":
        torch.cuda.empty_cache()


def fixed_batch(vocab: int, count: int, prompt: int, completion: int, seed: int = 0):
    import torch

    from trainer.transitions import Transition

    g = torch.Generator().manual_seed(seed)
    batch = []
    for i in range(count):
        ids = torch.randint(0, vocab, (prompt + completion,), generator=g).tolist()
        behaviour = (-torch.rand(completion, generator=g) * 3).tolist()
        batch.append(Transition(ids[:prompt], ids[prompt:], behaviour, advantage=1.0 if i % 2 else -1.0))
    return batch


# --- what the formulas say ----------------------------------------------------------------------------------
def forward_flops(shape: dict, vocab: int, prompt: int, completion: int, lora_params: int) -> float:
    """FLOPs of one forward pass over one sequence: the decoder's (`decoder_flops`) and the LM head's at the trained
    positions only (trainer/logprobs.py; every completion token of the fixed batch is trained)."""
    return decoder_flops(shape, prompt + completion, lora_params) + 2 * vocab * shape["hidden"] * completion


def decoder_flops(shape: dict, tokens: int, lora_params: int) -> float:
    """The decoder's part of a forward pass over `tokens`: its matmuls at the shape's own head_dim (Qwen3's 128 is
    not hidden / heads), causal attention and LoRA's two small matmuls; what activation checkpointing recomputes
    (the LM head runs outside the checkpointed layers)."""
    h, i, d = shape["hidden"], shape["intermediate"], shape["heads"] * shape["head_dim"]
    kv = shape["kv_heads"] * shape["head_dim"]
    linear = shape["layers"] * (h * d + 2 * h * kv + d * h + 3 * h * i)
    attention = shape["layers"] * 2 * tokens * tokens * d  # QK^T and AV, each 2*T*T*d, halved by the causal mask
    return 2 * linear * tokens + attention + 2 * lora_params * tokens


def predicted_gb(shape: dict, vocab: int, micro_batch_tokens: int, checkpointing: bool) -> float:
    """docs/scale.md's per-GPU formula (bench/scale.py) for this shape on one rank under torchrun: its own head_dim
    and tied head, and the root unit plus two layers gathered whole beside the shard (FSDP2's all-gather writes a
    buffer of its own even for one rank)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import scale

    table_shape = dict(layers=shape["layers"], hidden=shape["hidden"], intermediate=shape["intermediate"],
                       heads=shape["heads"], kv_heads=shape["kv_heads"], head_dim=shape["head_dim"],
                       tied=shape["tied"], vocab=vocab)
    coefficient = measured_activation_coefficient()
    act = scale.activation_bytes(table_shape, coefficient, checkpointing=checkpointing)
    return scale.per_gpu_gb(table_shape, 1, micro_batch_tokens, act, offload=False, sharded=True)


def measured_activation_coefficient(default: float = 7.8) -> float:
    """The activation coefficient bench/scale.py measured (its committed output), which the table uses."""
    text = (ROOT / "bench" / "results" / "scale.txt").read_text() if (ROOT / "bench/results/scale.txt").exists() else ""
    marker = " values of (hidden + intermediate"
    for line in text.splitlines():
        if marker in line and "= " in line:
            try:
                return float(line.split(marker)[0].rsplit("= ", 1)[1].split()[-1])
            except (IndexError, ValueError):
                continue
    return default


def step_flops(shape: dict, vocab: int, batch: list, lora: int, config, checkpointing: bool) -> tuple[float, float]:
    """(model, hardware) FLOPs of one trainer step over `batch`. Model: every epoch's forward and backward through
    the activations (about twice the forward), plus the forward passes the step needs besides: decoupled PPO's
    proximal pass over every mini-batch but the first (trainer/ppo.py), the base model's pass when a KL is wanted.
    Hardware adds the decoder's forward that activation checkpointing recomputes in every epoch's backward (not the
    LM head's: it is outside the checkpointed layers, and its backward is analytic)."""
    forward = sum(forward_flops(shape, vocab, len(t.prompt_ids), len(t.completion_ids), lora) for t in batch)
    decoder = sum(decoder_flops(shape, len(t), lora) for t in batch)
    shares = max(1, min(config.mini_batches, len(batch)))
    extra = forward * (shares - 1) / shares if config.proximal_policy == "recomputed" else 0.0
    extra += forward if config.needs_reference else 0.0
    model = 2 * forward * config.ppo_epochs + extra
    return model, model + (decoder * config.ppo_epochs if checkpointing else 0.0)


def peak_flops(device_name: str) -> float | None:
    return next((peak for name, peak in PEAK_BF16.items() if name in device_name), None)


# --- one shape, inside its torchrun rank -------------------------------------------------------------------------
def measure(args: argparse.Namespace) -> None:
    import torch

    from core.settings import TrainingSettings
    from trainer import parallel
    from trainer.ppo import PolicyTrainer

    shape = SHAPES[args.shape]
    vocab = shape.get("vocab", QWEN3_VOCAB)
    cuda = torch.cuda.is_available()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=args.workdir) as folder:
        save_random_model(shape, Path(folder), "cuda" if cuda else "cpu", "bfloat16" if cuda else "float32")
        built = time.perf_counter() - started
        collective = parallel.init_from_environment()
        config = TrainingSettings(lora_rank=32, lora_alpha=64, bf16=True, activation_checkpointing=args.checkpointing,
                                  max_seq_len=args.prompt + args.completion, seed=0)
        policy = PolicyTrainer(folder, config, collective=collective)
    loaded = time.perf_counter() - started - built
    batch = fixed_batch(vocab, args.batch, args.prompt, args.completion)
    policy.step(batch)  # warm-up: kernels, allocator
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    walls = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        metrics = policy.step(batch)
        if cuda:
            torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
    lora = sum(p.numel() for n, p in policy.model.named_parameters() if "lora_" in n) * collective.world_size
    wall = statistics.median(walls)
    model_flops, hardware_flops = step_flops(shape, vocab, batch, lora, policy.config, args.checkpointing)
    name = torch.cuda.get_device_name() if cuda else "cpu"
    peak = peak_flops(name) if cuda else None
    result = {
        "shape": args.shape, "device": name, "parameters": sum(p.numel() for p in policy.model.parameters()),
        "lora": lora, "tokens": metrics.tokens, "tokens_per_s": metrics.tokens / wall, "step_s": wall,
        "updates": metrics.updates, "micro_batch_tokens": policy.config.micro_batch_tokens,
        "model_tflops_per_s": model_flops / wall / 1e12,
        "mfu": model_flops / wall / peak if peak else None,
        "hfu": hardware_flops / wall / peak if peak else None,
        "peak_gb": torch.cuda.max_memory_allocated() / GB if cuda else None,
        "reserved_gb": torch.cuda.max_memory_reserved() / GB if cuda else None,
        "predicted_gb": predicted_gb(shape, vocab, policy.config.micro_batch_tokens, args.checkpointing),
        "checkpointing": args.checkpointing,
        "build_s": built, "load_s": loaded, "loss": metrics.loss, "autocast": policy.autocast_enabled,
    }
    if collective.rank == 0:
        print(RESULT + json.dumps(result), flush=True)
    torch.distributed.destroy_process_group()


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with the repository first on PYTHONPATH (whatever else was there stays)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def shape_row(r: dict) -> str:
    name = r["shape"] + ("" if r.get("checkpointing", True) else " no-ckpt")
    if "error" in r:
        return f"{name:<20} failed: {r['error']}"

    def pct(value):
        return f"{100 * value:5.1f}%" if value is not None else "   n/a"

    def gb(value):
        return f"{value:6.1f} GB" if value is not None else "     n/a"

    return (f"{name:<20}{r['parameters'] / 1e9:7.2f}B{r['lora'] / 1e6:7.1f}M{r['tokens']:>8}{r['step_s']:8.2f}"
            f"{r['tokens_per_s']:>10.0f}{r['model_tflops_per_s']:>9.1f}  {pct(r['mfu'])}  {pct(r['hfu'])}"
            f"  {gb(r['peak_gb'])}  {gb(r['reserved_gb'])}  {gb(r['predicted_gb'])}"
            f"{r['build_s']:7.0f}{r['load_s']:6.0f}")


SHAPE_HEADER = (f"{'shape':<20}{'params':>8}{'LoRA':>8}{'tokens':>8}{'step s':>8}{'tokens/s':>10}{'TFLOP/s':>9}"
                f"  {'MFU':>6}  {'HFU':>6}  {'peak alloc':>9}  {'reserved':>9}  {'table says':>9}{'build':>7}"
                f"{'load':>6}")
