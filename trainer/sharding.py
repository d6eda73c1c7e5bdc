"""The frozen base model sharded across ranks with PyTorch FSDP2, and the LoRA state made whole to be saved.

    shard(scorer, decoder_layers(peft_model), device, offload=False)   # fully_shard each layer, then the root
    lora_weights(peft_model)          # {saved name: whole tensor on the CPU}; all-gathers shards (every rank calls)
    load_lora_weights(peft_model, weights)    # every rank keeps its own shard of each tensor: no communication
    whole_optimizer_state(optimizer)  # the AdamW state as a single process has it (every rank calls)
    place_optimizer_state(optimizer)  # after optimizer.load_state_dict: each moment laid out like its parameter

Sharded parameters are DTensors (dim 0 split across ranks); before a module computes, FSDP all-gathers its shards
and frees the whole weights again after it (each decoder layer after its forward and again after its backward;
the root, which holds the embeddings, final norm and LM head, after backward). So a rank holds 1/N of the
base plus one or two layers at a time. The LoRA parameters are sharded the same way; their gradients are
reduce-scattered (summed: every rank's loss is already its share of the whole batch's token mean), and AdamW
updates each rank's shard.

Every helper here works on plain tensors too (a single process): the trainer has one code path either way.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

log = logging.getLogger(__name__)


def decoder_layers(peft_model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a Hugging Face model: the classes it names as never to be split across devices
    (sharded, a block's class is FSDP's subclass of its own)."""
    base = peft_model.get_base_model()
    blocks = set(getattr(base, "_no_split_modules", None) or ())
    layers = [module for module in base.modules() if any(c.__name__ in blocks for c in type(module).__mro__)]
    if not layers:
        raise ValueError(f"{type(base).__name__} names no decoder layer class (_no_split_modules): cannot shard it")
    return layers


def mesh_shape(mesh: str, world: int, local_world: int, base_bytes: int, device_bytes: int | None) -> tuple[int, int]:
    """(replicas, shards per replica) for the `mesh` setting (core/settings/training.py) over `world` ranks,
    `local_world` of them per node; `device_bytes` None on a CPU. auto: a whole copy per rank where the bf16 base
    takes under a third of a device (FSDP would all-gather all of it two or three times per micro-batch for
    nothing), else shards within a node and replicas across nodes when there are several, else shards."""
    if mesh == "auto":
        fits = device_bytes is not None and 3 * base_bytes < device_bytes
        mesh = "ddp" if fits else "hsdp" if world > local_world > 0 else "fsdp"
    if mesh == "ddp":
        return world, 1
    if mesh == "hsdp":
        if local_world <= 0 or world % local_world:
            raise ValueError(f"mesh=hsdp needs the same ranks on every node: {world} ranks, {local_world} per node")
        return world // local_world, local_world
    return 1, world


def shard(root: torch.nn.Module, layers: list[torch.nn.Module], device: torch.device, *, offload: bool,
          replicas: int = 1) -> None:
    """Shard `root` across the default process group's ranks: one FSDP unit per decoder layer (its shards are
    gathered just before it runs), then the root for the rest. With `offload`, shards live in CPU memory and are
    copied to the GPU unit by unit (AdamW then steps on the CPU; the LoRA state is small). `replicas` > 1: a 2-D
    mesh, the ranks split into that many groups holding the whole base each (HSDP: shards within a group,
    gradients summed across groups; one rank per group is plain replication)."""
    world = torch.distributed.get_world_size()
    mesh = (init_device_mesh(device.type, (world,)) if replicas == 1 else
            init_device_mesh(device.type, (replicas, world // replicas), mesh_dim_names=("replicate", "shard")))
    if offload and device.type == "cpu":
        log.info("offload_base has no effect on a CPU: the shards are in CPU memory already")
        offload = False
    policy = CPUOffloadPolicy() if offload else OffloadPolicy()
    for layer in layers:
        fully_shard(layer, mesh=mesh, offload_policy=policy)
    fully_shard(root, mesh=mesh, offload_policy=policy)
    for module in root.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)  # sum over ranks, do not average: losses are shares already
            module.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no pre-multiplied sum)


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor all-gathered into a plain tensor (a collective: every rank calls it, in the same order); a plain
    tensor as it is."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def laid_out_like(value: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """`value` (a whole tensor) on `param`'s device, and sharded as `param` is: each rank keeps its own slice of
    its own copy, so nothing is sent (every rank must hold the same `value`)."""
    value = value.to(param.device)
    if isinstance(param, DTensor):
        return distribute_tensor(value, param.device_mesh, param.placements, src_data_rank=None)
    return value


def lora_weights(peft_model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's tensors under the names peft saves them with (what vLLM loads), whole and on the CPU."""
    from peft import get_peft_model_state_dict

    return {name: whole(value).detach().to("cpu").contiguous()
            for name, value in get_peft_model_state_dict(peft_model).items()}


@torch.no_grad()
def load_lora_weights(peft_model: torch.nn.Module, weights: Mapping[str, torch.Tensor]) -> None:
    """Copy saved adapter tensors into the model's LoRA parameters (sharded or not). The names are matched the way
    `lora_weights` makes them, so what was saved loads back whatever the number of ranks."""
    from peft import get_peft_model_state_dict

    current = get_peft_model_state_dict(peft_model)  # detached views of the parameters themselves
    unexpected, missing = sorted(weights.keys() - current.keys()), sorted(current.keys() - weights.keys())
    if unexpected or missing:
        raise ValueError(f"adapter does not fit the model: unexpected {unexpected[:3]}, missing {missing[:3]}")
    for name, view in current.items():
        if tuple(weights[name].shape) != tuple(view.shape):
            raise ValueError(f"adapter tensor {name} has shape {tuple(weights[name].shape)}, "
                             f"the model {tuple(view.shape)}")
        view.copy_(laid_out_like(weights[name].to(view.dtype), view))


def whole_optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """`optimizer.state_dict()` with every moment whole and on the CPU: the same file whatever the rank count."""
    state = optimizer.state_dict()
    return {**state, "state": {index: {key: whole(value).to("cpu") if isinstance(value, torch.Tensor) else value
                                       for key, value in moments.items()}
                               for index, moments in sorted(state["state"].items())}}


def place_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """After `load_state_dict` of a whole state: each moment beside its parameter and sharded as it is (the step
    count stays a CPU scalar, as AdamW keeps it)."""
    for param, moments in optimizer.state.items():
        for key, value in moments.items():
            if key != "step" and isinstance(value, torch.Tensor):
                moments[key] = laid_out_like(value, param)
