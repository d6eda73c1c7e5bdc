"""The policy model built without the whole base in host memory on every rank.

    actor = load_actor(parts, model_path, lora=lora, device=device)                     # one process
    actor, root = load_sharded_actor(parts, model_path, lora=lora, dtype=torch.bfloat16, device=device,
                                     shard=shard_it, seed=seed)       # under torchrun; shard_it(peft_model) -> root
    check_device_memory(device, model_path, ranks)      # before either: room on the GPU, or one line saying why not

One process: transformers loads each tensor from the safetensors files straight onto `device` (`device_map`),
so a GPU trainer never holds the base in host memory.

Several ranks: the base is built on the meta device (no storage; buffers such as rotary frequencies are real, they
are small and computed, not loaded), wrapped with LoRA by peft, sharded by FSDP2 (still meta), given empty
storage, and every rank then reads only its own rows of each tensor from the safetensors files (plain reads
at the rows' offsets, not a memory map). Nothing is sent between ranks, and a rank's host memory holds at most
its rows of one tensor on their way to the device: OpenRLHF's Actor would have loaded the whole base on every
rank first (8 ranks x 16.4 GB for an 8B model in one pod). bench/load_memory.py measures it on CPU.

The LoRA weights are drawn as peft draws them in one process (the same seed, the same order: kaiming-uniform A,
zero B), whole on the CPU, then each rank keeps its slice, so one rank and several start from the same adapter
(tests/test_parallel.py compares their updates).
"""
from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from accelerate import init_empty_weights

from core.errors import RlproxyError
from core.hardware import DeviceMemoryError, trainer_bytes, trainer_memory_problem
from trainer.sharding import laid_out_like

log = logging.getLogger(__name__)
T = TypeVar("T")
# Architectures transformers' SDPA attention refuses: gpt-oss adds a learned sink to each head's softmax, which
# only its eager attention (or a kernel of the hub) computes.
EAGER_ONLY = frozenset({"gpt_oss"})


def attention_implementation(model_path: str | Path) -> str:
    """SDPA, except for an architecture that transformers serves only with its eager attention (EAGER_ONLY)."""
    try:
        model_type = json.loads((Path(model_path) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        model_type = None
    return "eager" if model_type in EAGER_ONLY else "sdpa"


class CheckpointMismatchError(RlproxyError, RuntimeError):
    """The safetensors files do not hold a tensor the model needs, or hold it in another shape."""


def lora_config(*, rank: int, alpha: int, dropout: float, target_modules: list[str] | str) -> Any:
    """The LoRA setup OpenRLHF's Actor makes (causal LM, no bias)."""
    from peft import LoraConfig, TaskType

    return LoraConfig(task_type=TaskType.CAUSAL_LM, r=rank, lora_alpha=alpha, target_modules=target_modules,
                      lora_dropout=dropout, bias="none")


def load_actor(parts: Any, model_path: str, *, lora: dict[str, Any], device: torch.device) -> Any:
    """OpenRLHF's Actor with the base loaded in bf16 straight onto `device` (one process)."""
    return parts.Actor(model_path, attn_implementation=attention_implementation(model_path), param_dtype="bf16",
                       device_map={"": str(device)}, lora_rank=lora["rank"], lora_alpha=lora["alpha"],
                       lora_dropout=lora["dropout"], target_modules=lora["target_modules"])


def load_sharded_actor(parts: Any, model_path: str, *, lora: dict[str, Any], dtype: torch.dtype,
                       device: torch.device, shard: Callable[[Any], T], seed: int) -> tuple[Any, T]:
    """OpenRLHF's Actor around a peft model whose base was never whole here, and what `shard(peft_model)` returned
    (it shards the model with FSDP2, on meta tensors); then this rank's rows of every base tensor are read from the
    checkpoint, in `dtype`. `device`: where the shards live (the CPU when they are offloaded)."""
    from peft import get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    # trust_remote_code as OpenRLHF's Actor loads the one-process model: the same classes either way
    config = AutoConfig.from_pretrained(model_path, trust_remote_code=True)
    with init_empty_weights(include_buffers=False):
        base = AutoModelForCausalLM.from_config(config, attn_implementation=attention_implementation(model_path),
                                                dtype=dtype, trust_remote_code=True)
    # A tied LM head is the embeddings' own parameter, as from_pretrained makes it (inside the context above every
    # parameter set becomes a new meta one, which would untie it again).
    base.tie_weights()
    model = get_peft_model(base, lora_config(**lora))  # LoRA on meta too: its values are drawn below
    model.config.use_cache = False
    fresh = _drawn_lora(model, seed)
    sharded = shard(model)
    # to_empty gives buffers new, uninitialised storage too: keep them (computed, and where FSDP placed them)
    buffers = [(module, name, buffer) for module in model.modules() for name, buffer in module._buffers.items()
               if buffer is not None]
    model.to_empty(device=device)
    for module, name, buffer in buffers:
        module._buffers[name] = buffer
    with torch.no_grad():
        _read_shards(model.get_base_model(), model_path)
        for name, param in model.named_parameters():
            if name in fresh:
                param.copy_(laid_out_like(fresh[name].to(param.dtype), param))
    return parts.Actor(model), sharded


def _drawn_lora(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """The LoRA weights peft draws in one process after `torch.manual_seed(seed)`, adapted module by module in the
    model's order: it builds A and B as torch Linears (each constructor draws its weight, kaiming-uniform a=sqrt 5,
    in float32), then draws A again and zeroes B (`init_lora_weights=True`), rounded to bf16 on the way. The same
    draws, in the same order."""
    torch.manual_seed(seed)
    drawn = {}
    for module_name, module in model.named_modules():
        if not (hasattr(module, "lora_A") and hasattr(module, "lora_B")):
            continue
        for adapter, a in module.lora_A.items():
            b = module.lora_B[adapter]
            for shape in (a.weight.shape, b.weight.shape):  # what the constructors draw (then overwritten)
                torch.nn.init.kaiming_uniform_(torch.empty(shape), a=math.sqrt(5))
            weight = torch.empty(a.weight.shape)
            torch.nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
            # peft then casts the adapter to the base's dtype (bf16 as OpenRLHF loads it) and back to float32
            drawn[f"{module_name}.lora_A.{adapter}.weight"] = weight.to(torch.bfloat16).float()
            drawn[f"{module_name}.lora_B.{adapter}.weight"] = torch.zeros(b.weight.shape)
    return drawn


def checkpoint_name(parameter_name: str) -> str:
    """The safetensors key of a base parameter under peft (which moves an adapted Linear's weight to base_layer)."""
    return parameter_name.replace(".base_layer.", ".")


# safetensors' dtype names (its format's specification)
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


def _read_shards(base: torch.nn.Module, model_path: str) -> None:
    """Fill every base parameter's local part (a DTensor's shard, or a plain tensor whole) from the checkpoint,
    reading only those rows. Read with plain file reads, not through a memory map: the mapped pages of what a
    rank read would count in its resident memory until the file closes (for a float32 checkpoint, twice the
    bf16 shard), while read pages stay in the page cache, which the kernel reclaims."""
    wanted = {checkpoint_name(name): param for name, param in base.named_parameters() if "lora_" not in name}
    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        raise CheckpointMismatchError(f"no *.safetensors files in {model_path}: cannot load the base by shards")
    for file in files:
        data_start, entries = _safetensors_index(file)
        with file.open("rb", buffering=0) as stream:
            for key, entry in entries.items():
                param = wanted.pop(key, None)
                if param is not None:
                    _copy_rows(param, stream, data_start, entry, key)
    if wanted:
        raise CheckpointMismatchError(f"{model_path} lacks {len(wanted)} tensors of the model: {sorted(wanted)[:3]}")


def _safetensors_index(file: Path) -> tuple[int, dict[str, dict[str, Any]]]:
    """Where a safetensors file's data starts, and each tensor's dtype, shape and byte range within it."""
    with file.open("rb") as stream:
        length = int.from_bytes(stream.read(8), "little")
        header = json.loads(stream.read(length))
    header.pop("__metadata__", None)
    return 8 + length, header


def _copy_rows(param: torch.Tensor, stream: Any, data_start: int, entry: dict[str, Any], key: str) -> None:
    from torch.distributed.tensor import DTensor

    shape, dtype = tuple(entry["shape"]), _DTYPES.get(entry["dtype"])
    if shape != tuple(param.shape) or dtype is None:
        raise CheckpointMismatchError(f"{key}: the checkpoint has {entry['dtype']} {shape}, the model "
                                      f"{tuple(param.shape)}")
    local, first = param, 0
    if isinstance(param, DTensor):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        local = param.to_local()
        local_shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
        if tuple(local_shape[1:]) != shape[1:]:
            raise CheckpointMismatchError(f"{key}: sharded along another dimension than the first")
        first = offset[0]
    rows = local.shape[0] if local.dim() else 1
    if local.numel() == 0:
        return
    row_bytes = math.prod(shape[1:]) * dtype.itemsize
    buffer = bytearray(rows * row_bytes)
    stream.seek(data_start + entry["data_offsets"][0] + first * row_bytes)
    if stream.readinto(buffer) != len(buffer):
        raise CheckpointMismatchError(f"{key}: the file ends inside the tensor")
    local.copy_(torch.frombuffer(buffer, dtype=dtype).reshape(local.shape))


def checkpoint_parameters(model_path: str) -> int:
    """Elements in the checkpoint's safetensors files, from their headers alone (nothing is loaded)."""
    return sum(math.prod(entry["shape"]) for file in sorted(Path(model_path).glob("*.safetensors"))
               for entry in _safetensors_index(file)[1].values())


def check_device_memory(device: torch.device, model_path: str, ranks: int) -> None:
    """Before the load: stop with one line saying what to change when `device` (a GPU) lacks the room this rank's
    part of the model needs (core/hardware.py), rather than failing with a CUDA OOM halfway through it."""
    if device.type != "cuda":
        return
    free, total = torch.cuda.mem_get_info(device)
    problem = trainer_memory_problem(str(device), free, total, trainer_bytes(checkpoint_parameters(model_path), ranks))
    if problem:
        raise DeviceMemoryError(problem)
