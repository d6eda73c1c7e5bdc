"""The trainer on 1, 2 and 4 ranks (the base sharded with FSDP2) on this machine, and what that says about 8B, 32B and
70B models on GPUs.

    .venv/bin/python bench/scale.py                          # the bundled model; 1 process, 1/2/4 ranks
    .venv/bin/python bench/scale.py --ranks 1,2 --steps 2    # fewer
    .venv/bin/python bench/scale.py --model DIR --context 32768

Measured, per configuration, each in fresh processes on the same demo-shaped batch (16 transitions of about 230
prompt and 50 completion tokens, the trainer's default settings): per rank, the parameter memory it stores
(the sum of its tensors: its shards) and the peak resident memory of the whole process during a step (VmHWM,
reset before the step: start-up, which reads the whole checkpoint on every rank, is left out); the step's
wall time (median) and tokens per second over all ranks; their ratio to the unsharded process. "1 process" is
`rlproxy train` as it runs alone (no process group, the model unsharded); "N ranks" runs under torchrun.
The cores are split among the ranks (OMP_NUM_THREADS); with more ranks than cores they share them.

Then a table computed from the activation memory per token measured here (unsharded, and with activation
checkpointing) and from printed assumptions (model shapes, bfloat16 weights, LoRA r=8 on the attention
projections, GPU size, fixed overheads): memory per GPU for 1 to 64 GPUs and the fewest GPUs that fit, at the
given context length, for one sequence per micro-batch.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GB = 1e9
RESULT = "RESULT "


# --- one configuration, inside its rank(s) ----------------------------------------------------------------
def _vm(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))


def demo_batch(vocab: int, count: int = 16):
    import torch

    from trainer.transitions import Transition

    g = torch.Generator().manual_seed(0)
    batch = []
    for i in range(count):
        prompt = int(230 * (0.85 + 0.3 * float(torch.rand((), generator=g))))
        completion = int(50 * (0.5 + float(torch.rand((), generator=g))))
        ids = torch.randint(0, vocab, (prompt + completion,), generator=g).tolist()
        batch.append(Transition(ids[:prompt], ids[prompt:], [-5.0] * completion, advantage=1.0 if i % 2 else -1.0))
    return batch


def parameter_bytes(policy) -> dict[str, int]:
    """Bytes this rank stores (its shards), and what FSDP gathers whole at once during a step: the root unit
    (embeddings, final norm, LM head; kept whole from forward to the end of backward) and two decoder layers (the
    one computing and the next, prefetched)."""
    from torch.distributed.tensor import DTensor

    from trainer.sharding import decoder_layers

    def size(params) -> int:
        return sum(p.numel() * p.element_size() for p in params)

    params = list(policy.model.parameters())
    stored = sum((p.to_local() if isinstance(p, DTensor) else p).numel() * p.element_size() for p in params)
    layers = decoder_layers(policy.model)
    in_layers = {id(p) for layer in layers for p in layer.parameters()}
    root = size(p for p in params if id(p) not in in_layers)
    layer = max(size(layer.parameters()) for layer in layers)
    return {"stored": stored, "whole": size(params), "gathered": (root + 2 * layer) if policy.collective.sharded else 0}


def measure(args: argparse.Namespace) -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # spinning OpenMP threads stall shared cores
    import torch

    from trainer import parallel
    from core.settings import TrainingSettings
    from trainer.ppo import PolicyTrainer

    collective = parallel.init_from_environment() if parallel.launched_by_torchrun() else parallel.Collective()
    policy = PolicyTrainer(args.model, TrainingSettings(activation_checkpointing=args.checkpointing),
                           collective=collective)
    batch = demo_batch(policy.model.config.vocab_size)
    policy.step(batch)  # warm-up: allocator, kernels
    walls, peaks, before = [], [], []
    for _ in range(args.steps):
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        before.append(_vm("VmRSS"))
        started = time.perf_counter()
        metrics = policy.step(batch)
        walls.append(time.perf_counter() - started)
        peaks.append(_vm("VmHWM"))
    mine = {"rank": collective.rank, "threads": torch.get_num_threads(), "params": parameter_bytes(policy),
            "peak": max(peaks), "before": min(before), "wall": statistics.median(walls), "tokens": metrics.tokens,
            "micro_batch_tokens": policy.config.micro_batch_tokens, "micro_batches": metrics.micro_batches,
            "loss": metrics.loss, "element": 2 if policy.autocast_enabled else 4}
    ranks = [mine]
    if collective.world_size > 1:
        ranks = [None] * collective.world_size
        torch.distributed.all_gather_object(ranks, mine)
    if collective.rank == 0:
        print(RESULT + json.dumps(ranks), flush=True)
    if collective.sharded:
        torch.distributed.destroy_process_group()


def run(model: str, ranks: int | None, steps: int, checkpointing: bool = False) -> list[dict]:
    """One configuration in fresh processes: alone (ranks None) or under torchrun; each rank's measurements."""
    cores = os.cpu_count() or 1
    threads = max(1, cores // (ranks or 1))
    launcher = [sys.executable] if ranks is None else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                      f"--nproc-per-node={ranks}"]
    command = [*launcher, __file__, "measure", "--model", model, "--steps", str(steps)]
    if checkpointing:
        command.append("--checkpointing")
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)})
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT):])


# --- what bigger models need ------------------------------------------------------------------------------
# Public configurations (Hugging Face config.json) of one model per size.
SHAPES = {
    "8B (Llama-3.1-8B)": dict(layers=32, hidden=4096, intermediate=14336, heads=32, kv_heads=8, vocab=128256),
    "32B (Qwen2.5-32B)": dict(layers=64, hidden=5120, intermediate=27648, heads=40, kv_heads=8, vocab=152064),
    "70B (Llama-3.1-70B)": dict(layers=80, hidden=8192, intermediate=28672, heads=64, kv_heads=8, vocab=128256),
}
GPU_GB = 80.0  # an H100 / A100 80 GB
FIXED_GB = 4.0  # CUDA context, NCCL buffers, allocator fragmentation, LM-head chunks (trainer/logprobs.py)
WEIGHT_BYTES = 2  # bfloat16 base weights and activations
LORA_BYTES = 16  # per LoRA parameter: float32 weight, gradient and two AdamW moments
LORA_RANK = 8
GPU_COUNTS = (1, 2, 4, 8, 16, 32, 64)


def model_numbers(shape: dict) -> dict[str, float]:
    h, i, layers = shape["hidden"], shape["intermediate"], shape["layers"]
    head_dim = shape.get("head_dim") or h // shape["heads"]  # Qwen3 sets its own (128 where hidden / heads is 64)
    q, kv = shape["heads"] * head_dim, shape["kv_heads"] * head_dim
    layer = 2 * h * q + 2 * h * kv + 3 * h * i + 2 * h
    embeddings = (1 if shape.get("tied") else 2) * shape["vocab"] * h  # input embeddings and an untied LM head
    lora = layers * LORA_RANK * ((h + q) * 2 + (h + kv) * 2)  # q: h -> q, o: q -> h; k, v: h -> kv
    return {"params": layers * layer + embeddings + h, "layer": layer, "root": embeddings + h, "lora": lora}


def per_gpu_gb(shape: dict, gpus: int, context: int, act_per_token: float, offload: bool,
               sharded: bool = False) -> float:
    """Memory per GPU: the base's shard (none with offload), what FSDP gathers whole (root + 2 layers; also on one
    rank under torchrun, `sharded`: the gathered copy is a buffer of its own), the LoRA state's shard, activations
    of one sequence of `context` tokens, fixed overheads."""
    n = model_numbers(shape)
    shard = 0 if offload else n["params"] * WEIGHT_BYTES / gpus
    gathered = (n["root"] + 2 * n["layer"]) * WEIGHT_BYTES if gpus > 1 or offload or sharded else 0
    return (shard + gathered + n["lora"] * LORA_BYTES / gpus + context * act_per_token) / GB + FIXED_GB


def activation_bytes(shape: dict, coefficient: float, checkpointing: bool) -> float:
    """Bytes per token: `coefficient` values of (hidden + intermediate) size per layer (measured here), or with
    checkpointing the layers' inputs (one hidden vector each) plus one layer recomputed."""
    width = shape["hidden"] + shape["intermediate"]
    if checkpointing:
        return (shape["layers"] * shape["hidden"] + coefficient * width) * WEIGHT_BYTES
    return shape["layers"] * coefficient * width * WEIGHT_BYTES


def extrapolate(coefficient: float, context: int) -> list[str]:
    out = [f"Assumptions: {GPU_GB:.0f} GB GPUs; bfloat16 base weights and activations ({WEIGHT_BYTES} bytes); LoRA "
           f"r={LORA_RANK} on q,k,v,o with float32 weight, gradient and AdamW moments ({LORA_BYTES} bytes/parameter), "
           f"sharded; FSDP holds the root unit and two decoder layers whole during a step; {FIXED_GB:.0f} GB fixed "
           f"per GPU; one sequence of {context} tokens per micro-batch; activations {coefficient:.2f} values of "
           f"(hidden + intermediate) per layer per token (measured above), or with checkpointing one hidden vector "
           f"per layer plus one layer's worth.",
           f"{'model':<22}{'mode':<26}" + "".join(f"{f'{g} GPU':>9}" for g in GPU_COUNTS) + "   fewest GPUs"]
    modes = (("all activations", False, False), ("checkpointing", True, False), ("checkpointing + offload", True, True))
    for name, shape in SHAPES.items():
        numbers = model_numbers(shape)
        for label, checkpointing, offload in modes:
            act = activation_bytes(shape, coefficient, checkpointing)
            sizes = [per_gpu_gb(shape, g, context, act, offload) for g in GPU_COUNTS]
            fits = next((g for g, size in zip(GPU_COUNTS, sizes) if size <= GPU_GB), None)
            out.append(f"{name:<22}{label:<26}" + "".join(f"{size:>6.0f} GB" for size in sizes)
                       + f"   {fits or '> ' + str(GPU_COUNTS[-1])}")
        cpu = numbers["params"] * WEIGHT_BYTES / GB
        out.append(f"{'':<22}({numbers['params'] / 1e9:.1f}B parameters, {numbers['lora'] / 1e6:.0f}M LoRA; "
                   f"offload keeps {cpu:.0f} GB of shards in host memory over all ranks)")
    return out


# --- the report -----------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode")
    inner = sub.add_parser("measure", help="(internal) one configuration, in this process or rank")
    inner.add_argument("--model", required=True)
    inner.add_argument("--steps", type=int, default=2)
    inner.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--model", help="Hugging Face model folder (default: the bundled model)")
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--steps", type=int, default=2, help="measured steps per configuration, after a warm-up")
    parser.add_argument("--context", type=int, default=8192, help="tokens per sequence in the computed table")
    args = parser.parse_args()
    if args.mode == "measure":
        measure(args)
        return
    if args.model is None:
        from engine.model import default_model_path

        args.model = str(default_model_path())
    print(f"model: {args.model} | {os.cpu_count()} cores | load average {os.getloadavg()[0]:.1f} at the start")
    rows = [("1 process", run(args.model, None, args.steps))]
    for n in map(int, args.ranks.split(",")):
        rows.append((f"{n} rank{'s' if n > 1 else ''}", run(args.model, n, args.steps)))
    rows.append(("1 process, checkpointing", run(args.model, None, args.steps, checkpointing=True)))
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    coefficient = report(rows, args.model)
    print("\n" + "\n".join(extrapolate(coefficient, args.context)))


def report(rows: list[tuple[str, list[dict]]], model: str) -> float:
    """The measured table and per-token costs; returns the activation coefficient the computed table uses."""
    from transformers import AutoConfig

    base, checkpointed = rows[0][1][0], rows[-1][1][0]
    base_rate = base["tokens"] / base["wall"]
    print(f"\n{'per rank (the largest)':<26}{'threads':>8}{'params stored':>15}{'+ gathered':>12}{'process peak':>14}"
          f"{'step s':>8}{'tokens/s':>10}{'vs 1 process':>14}")
    for label, ranks in rows:
        r = max(ranks, key=lambda x: x["peak"])
        wall = statistics.median(x["wall"] for x in ranks)
        print(f"{label:<26}{r['threads']:>8}{r['params']['stored'] / GB:>12.3f} GB"
              f"{r['params']['gathered'] / GB:>9.3f} GB{r['peak'] / GB:>11.2f} GB{wall:>8.1f}"
              f"{r['tokens'] / wall:>10.0f}{r['tokens'] / wall / base_rate:>14.2f}")
    print(f"(whole model: {base['params']['whole'] / GB:.3f} GB of parameters; a step: {base['tokens']} tokens in "
          f"{base['micro_batches']} micro-batches of <= {base['micro_batch_tokens']} tokens; the last step's loss in "
          f"each row, the same batch trained alike: {', '.join(format(r[0]['loss'], '.6f') for _, r in rows)})")

    config = AutoConfig.from_pretrained(model)
    width, element = config.hidden_size + config.intermediate_size, base["element"]  # float32 here: 4 bytes
    per_token = (base["peak"] - base["before"]) / base["micro_batch_tokens"]
    per_token_ac = (checkpointed["peak"] - checkpointed["before"]) / checkpointed["micro_batch_tokens"]
    coefficient = per_token / (config.num_hidden_layers * width * element)
    predicted_ac = (config.num_hidden_layers * config.hidden_size + coefficient * width) * element
    print(f"\nMeasured per-token costs (1 process, {element}-byte values; a step's peak over its start, per token of "
          f"the micro-batch budget): activations {per_token / 1e6:.2f} MB per token = {coefficient:.2f} values of "
          f"(hidden + intermediate = {width}) per layer per token; with activation checkpointing "
          f"{per_token_ac / 1e6:.2f} MB per token (the formula below predicts {predicted_ac / 1e6:.2f}).")
    return coefficient


if __name__ == "__main__":
    main()
