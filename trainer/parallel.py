"""Data-parallel training across processes with torch.distributed: one process per GPU (NCCL), or several
CPU processes (gloo). The code path is the same either way, which is how the multi-GPU trainer is tested on
machines without a GPU.

Launch: `rlproxy train --nproc-per-node 8 ...` (starts torchrun), or torchrun itself across machines:
`torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29400 -m rlproxy.cli train ...`
(every machine must see the adapters folder: the helm chart's shared volume).

Roles. Rank 0 is the worker (trainer/worker.py): it claims rollouts, builds transitions, saves and publishes
adapters and serves metrics; it is the only rank that talks to Postgres or the engines. Every other rank runs
`follow()`: it waits for rank 0's next command and runs it on its own replica of the policy. Within a step
every rank takes its own share of every mini-batch; each rank's loss is already divided by the token count
of the whole mini-batch, so summing gradients across ranks gives the single-process gradient, and every
rank applies the same update: the replicas never drift apart (tests/test_parallel.py checks this).

Why plain torch.distributed rather than DeepSpeed ZeRO: with LoRA the trained state (adapter, its gradients
and AdamW moments) is a few MB, so sharding it (ZeRO-1/2) saves nothing, while every rank needs the frozen
base weights for its forward pass anyway. ZeRO-3 (sharding the base weights) matters only for models that
do not fit one GPU; docs/deploy.md says what that takes.
"""
from __future__ import annotations

import datetime
import logging
import os
from typing import Any

import torch

log = logging.getLogger("rlproxy.trainer")

# Followers wait in a collective while rank 0 polls for work, possibly for hours; torchrun stops every rank
# when one fails, so a long timeout never leaves a rank hanging.
IDLE_TIMEOUT = datetime.timedelta(days=7)


class Collective:
    """What PolicyTrainer needs from its peers. This default is a single process: nothing to exchange."""

    rank = 0
    world_size = 1
    local_rank = 0

    def sum_(self, tensor: torch.Tensor) -> None:
        """Sum `tensor` over all ranks, in place."""

    def max(self, value: float) -> float:
        return value

    def broadcast_(self, tensor: torch.Tensor) -> None:
        """Overwrite `tensor` with rank 0's."""

    def send(self, message: Any) -> Any:
        """Rank 0: hand a picklable message to every other rank. Others: receive it (pass None)."""
        return message


class TorchCollective(Collective):
    """torch.distributed's default process group (set up by `init_from_environment`)."""

    def __init__(self, rank: int, world_size: int, local_rank: int, device: torch.device) -> None:
        self.rank, self.world_size, self.local_rank, self.device = rank, world_size, local_rank, device

    def sum_(self, tensor: torch.Tensor) -> None:
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)

    def max(self, value: float) -> float:
        box = torch.tensor([value], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(box, op=torch.distributed.ReduceOp.MAX)
        return float(box.item())

    def broadcast_(self, tensor: torch.Tensor) -> None:
        torch.distributed.broadcast(tensor, src=0)

    def send(self, message: Any) -> Any:
        box = [message]
        torch.distributed.broadcast_object_list(box, src=0, device=self.device)
        return box[0]


def launched_by_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init_from_environment() -> TorchCollective:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR, ...): NCCL on GPUs, else gloo."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    torch.distributed.init_process_group(backend=backend, timeout=IDLE_TIMEOUT)
    collective = TorchCollective(rank=torch.distributed.get_rank(), world_size=torch.distributed.get_world_size(),
                                 local_rank=local_rank, device=device)
    log.info("rank %d of %d on %s (%s)", collective.rank, collective.world_size, device, backend)
    return collective


class LeaderPolicy:
    """Rank 0's policy: a PolicyTrainer whose step and load also run on every other rank."""

    def __init__(self, policy, collective: Collective) -> None:
        self.policy = policy
        self.collective = collective

    @classmethod
    def start(cls, build, adapter_dir, collective: Collective) -> "LeaderPolicy":
        """Build rank 0's replica (`build(adapter_dir)`) after telling the others to build theirs."""
        collective.send(("start", adapter_dir))
        return cls(build(adapter_dir), collective)

    def step(self, transitions):
        self.collective.send(("step", transitions))
        return self.policy.step(transitions)

    def load(self, adapter_dir) -> None:
        self.collective.send(("load", adapter_dir))
        self.policy.load(adapter_dir)

    def close(self) -> None:
        self.collective.send(("stop", None))

    def __getattr__(self, name: str):  # save_adapter, logprobs, ...: rank 0's replica alone
        return getattr(self.policy, name)


def follow(build, collective: Collective) -> int:
    """A rank other than 0: build the policy when told, then run rank 0's commands until it stops.
    Returns the number of steps taken."""
    policy, steps = None, 0
    while True:
        command, argument = collective.send(None)
        if command == "start":
            policy = build(argument)
        elif command == "step":
            policy.step(argument)
            steps += 1
        elif command == "load":
            policy.load(argument)
        elif command == "stop":
            log.info("rank %d: stopped after %d steps", collective.rank, steps)
            return steps
        else:
            raise RuntimeError(f"rank {collective.rank}: unknown command {command!r} from rank 0")
