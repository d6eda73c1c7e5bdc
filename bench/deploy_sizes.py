"""The sizes docs/deploy.md and the chart's example values (helm/rlproxy/examples/) quote, computed from each model's
published shape (config.json) and the LoRA shapes the trainer makes: no measurement, plain arithmetic.

    python bench/deploy_sizes.py                 # the table (bench/results/deploy_sizes.txt is its output)
    python bench/deploy_sizes.py --check         # exit 1 when an example's trainer memory differs from the formula

Per model: parameters; the engine's bf16 weights; one adapter version on disk (adapter_model.safetensors in float32
plus optimizer.pt, AdamW's two float32 moments: 12 bytes per LoRA parameter, trainer/adapter.py) at the trainer's
default r=8 and at r=32, on q, k, v and o (k and v project to kv_heads x head_dim); and the trainer pod's host memory:

    trainer memory per pod = 1.25 x (ranks per pod x FIXED_RANK_GIB + WORKER_GIB + load buffer + adapter state)

FIXED_RANK_GIB: what one rank holds in host memory before any weight (CUDA torch, transformers, peft, OpenRLHF and the
CUDA context's host side; 0.46 GiB for CPU torch in bench/results/load_memory.txt, CUDA's libraries add the rest; an
estimate until bench/gpu_check.py measures one). Load buffer: the weights never pass whole through host memory (one
process loads each tensor straight onto its GPU; several ranks read only their rows, trainer/loading.py), so at most
the largest tensor (the embeddings) is in host memory at once, per rank its share. Adapter state: rank 0 holds the
LoRA weights and AdamW moments whole on the CPU while it saves (12 bytes per LoRA parameter), twice (the tensors and
the file being written). WORKER_GIB: rank 0's worker (batches, the store's rows, the metrics server); every pod gets
the same spec. 1.25: headroom for the allocator.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GB, GiB = 1e9, 2**30
FIXED_RANK_GIB = 4.0
WORKER_GIB = 2.0  # rank 0's worker: batches, transitions, the store's rows, the metrics server
HEADROOM = 1.25
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")  # the trainer's default target_modules
DEFAULT_RANK = 8  # core/settings/training.py lora_rank

# Published configurations: hidden, intermediate, layers, heads, kv heads, head_dim, vocabulary, tied head.
MODELS = {
    "Qwen/Qwen3-8B": dict(hidden=4096, intermediate=12288, layers=36, heads=32, kv_heads=8, head_dim=128,
                          vocab=151936, tied=False),
    "Qwen/Qwen3-32B": dict(hidden=5120, intermediate=25600, layers=64, heads=64, kv_heads=8, head_dim=128,
                           vocab=151936, tied=False),
    "meta-llama/Llama-3.3-70B-Instruct": dict(hidden=8192, intermediate=28672, layers=80, heads=64, kv_heads=8,
                                              head_dim=128, vocab=128256, tied=False),
}
EXAMPLES = {"8b.yaml": "Qwen/Qwen3-8B", "32b.yaml": "Qwen/Qwen3-32B", "70b.yaml": "meta-llama/Llama-3.3-70B-Instruct"}


def parameters(shape: dict) -> int:
    h, i, q, kv = shape["hidden"], shape["intermediate"], shape["heads"] * shape["head_dim"], \
        shape["kv_heads"] * shape["head_dim"]
    layer = 2 * h * q + 2 * h * kv + 3 * h * i + 2 * h  # q, o; k, v; gate, up, down; two norms
    return shape["layers"] * layer + (1 if shape["tied"] else 2) * shape["vocab"] * h + h


def lora_parameters(shape: dict, rank: int, targets: tuple[str, ...] = TARGETS) -> int:
    """A (r x in) and B (out x r) per adapted projection and layer."""
    h, q, kv = shape["hidden"], shape["heads"] * shape["head_dim"], shape["kv_heads"] * shape["head_dim"]
    sizes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}
    return shape["layers"] * sum(rank * (sizes[t][0] + sizes[t][1]) for t in targets)


def version_bytes(shape: dict, rank: int) -> int:
    """One adapter version folder: float32 weights (4 bytes) and AdamW's two float32 moments (8 bytes)."""
    return 12 * lora_parameters(shape, rank)


def trainer_memory_gib(shape: dict, ranks_per_pod: int, ranks: int, rank: int = DEFAULT_RANK) -> int:
    """The trainer pod's host memory limit, GiB (rounded up): the formula in the module docstring."""
    largest = shape["vocab"] * shape["hidden"] * 2  # the embeddings in bf16, the largest tensor
    load_buffer = largest / ranks * ranks_per_pod
    adapter_state = 2 * 12 * lora_parameters(shape, rank)
    need = (ranks_per_pod * FIXED_RANK_GIB + WORKER_GIB) * GiB + load_buffer + adapter_state
    return math.ceil(HEADROOM * need / GiB)


def example_trainer(name: str) -> tuple[int, int, str | None]:
    """(ranks per pod, ranks, memory limit) of a chart example's trainer."""
    import yaml

    trainer = yaml.safe_load((ROOT / "helm/rlproxy/examples" / name).read_text())["trainer"]
    per_pod = int(trainer.get("nprocPerNode") or trainer["gpu"] or 1)
    limit = ((trainer.get("resources") or {}).get("limits") or {}).get("memory")
    return per_pod, per_pod * int(trainer["nodes"]), limit


def report() -> list[str]:
    lines = ["## python bench/deploy_sizes.py (arithmetic on the published shapes; docs/deploy.md quotes it)",
             f"{'model':<36}{'params':>8}{'engine bf16':>13}{'version r=8':>13}{'version r=32':>14}"
             f"{'trainer pod':>13}  (example)"]
    for example, model in EXAMPLES.items():
        shape = MODELS[model]
        per_pod, ranks, _ = example_trainer(example)
        lines.append(f"{model:<36}{parameters(shape) / 1e9:>7.2f}B{2 * parameters(shape) / GB:>10.1f} GB"
                     f"{version_bytes(shape, 8) / 1e6:>10.0f} MB{version_bytes(shape, 32) / 1e6:>11.0f} MB"
                     f"{trainer_memory_gib(shape, per_pod, ranks):>9d} GiB  ({example}: {ranks} rank(s), "
                     f"{per_pod} per pod)")
    lines.append(f"trainer pod = {HEADROOM} x (ranks per pod x {FIXED_RANK_GIB:.0f} GiB + {WORKER_GIB:.0f} GiB + embeddings / ranks x ranks "
                 f"per pod + 24 bytes x LoRA parameters), at r={DEFAULT_RANK}; a version is 12 bytes per LoRA "
                 f"parameter (float32 weights + two AdamW moments)")
    return lines


def check() -> list[str]:
    """Examples whose trainer memory limit is not the formula's."""
    wrong = []
    for example, model in EXAMPLES.items():
        per_pod, ranks, limit = example_trainer(example)
        want = f"{trainer_memory_gib(MODELS[model], per_pod, ranks)}Gi"
        if limit != want:
            wrong.append(f"{example}: trainer.resources.limits.memory is {limit}, the formula says {want}")
    return wrong


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare the chart's examples with the formula")
    args = parser.parse_args()
    if args.check:
        wrong = check()
        print("\n".join(wrong) or "the examples' trainer memory is the formula's")
        sys.exit(1 if wrong else 0)
    print("\n".join(report()))


if __name__ == "__main__":
    main()
