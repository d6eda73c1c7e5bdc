"""What the machine has and does fast: precisions (`fast_bf16` imports torch: call it where torch is installed), the
GPUs a process would see, the engine's dtype, and whether the trainer's device has room for its model."""
from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from pathlib import Path

from core.errors import RlproxyError

GiB = 2**30


def fast_bf16() -> bool:
    """Whether bfloat16 matmuls are fast here. Without AVX512-BF16 or AMX a CPU runs them on a slow path:
    on a 2-core AVX2 EPYC, 1.2 GFLOPS vs 35 in float32 for torch, and vLLM served 14 vs 40 tokens/s at
    8 streams (10 vs 18 with a LoRA adapter) in bfloat16 vs float32."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)


# --- placement and precision on GPUs (docs/deploy.md, "One machine, several GPUs") ----------------------------------
NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")  # one folder per GPU the driver sees


class DeviceMemoryError(RlproxyError, RuntimeError):
    """The trainer's device has too little free memory for the model it is about to load."""


def visible_gpus(environ: Mapping[str, str] | None = None, driver: Path = NVIDIA_GPUS) -> int:
    """How many GPUs a process started here would see, without importing torch (the proxy and `rlproxy serve` run
    without it): CUDA_VISIBLE_DEVICES where it is set, else the driver's list."""
    environ = os.environ if environ is None else environ
    chosen = environ.get("CUDA_VISIBLE_DEVICES")
    if chosen is not None:
        ids = [part for part in chosen.split(",") if part.strip()]
        # CUDA stops at the first invalid entry ("-1" hides every GPU)
        return len(list(itertools.takewhile(lambda part: not part.strip().startswith("-"), ids)))
    try:
        return sum(1 for entry in driver.iterdir() if entry.is_dir())
    except OSError:  # no NVIDIA driver here
        return 0


def engine_dtype(gpus: int) -> str:
    """vLLM's --dtype: on GPUs `auto` (the checkpoint's bf16: half the weights' memory of float32, tensor cores);
    on a CPU float32, so the sampled log-probs match the float32 trainer's (engine/command.py)."""
    return "auto" if gpus > 0 else "float32"


def trainer_memory_problem(device: str, free: int, total: int, needed: int) -> str | None:
    """One line saying what to change when `device` has less than `needed` bytes free, else None."""
    if free >= needed:
        return None
    taken = total - free
    hint = (f"{taken / GiB:.1f} GiB of it are taken, likely by an engine on the same GPU: give the trainer other "
            f"GPUs (CUDA_VISIBLE_DEVICES for `rlproxy train`, e.g. the engine on 0 and the trainer on 1-7), "
            f"or lower the engine's --gpu-memory-utilization" if taken > 0.1 * total else
            "shard the base over more ranks (--nproc-per-node), or set offload_base")
    return (f"{device} has {free / GiB:.1f} GiB free of {total / GiB:.1f} GiB, the trainer needs about "
            f"{needed / GiB:.1f} GiB for this model: {hint}")


def trainer_bytes(base_parameters: int, ranks: int, lora_parameters: int = 0) -> int:
    """What one trainer rank needs on its GPU before activations: its bf16 shard of the base, with several ranks
    the largest units FSDP gathers whole (about 2/num_layers of the base; taken as 10% here), the LoRA state
    (float32 weight, gradient, two AdamW moments) and 2 GiB for activations of a micro-batch and the CUDA context."""
    base = 2 * base_parameters
    gathered = base // 10 if ranks > 1 else 0
    return base // ranks + gathered + 16 * lora_parameters // ranks + 2 * GiB
