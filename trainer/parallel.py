"""Training across processes: the frozen base model sharded over the ranks with PyTorch FSDP2 (trainer/sharding.py),
one process per GPU (NCCL) or several CPU processes (gloo). One code path for one rank, several on one machine
and several over machines: torchrun starts the ranks and tells each who it is; the rest is torch.distributed.

Launch: `rlproxy train --nproc-per-node 8 ...` (starts torchrun), or torchrun itself across machines:
`torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29400 -m rlproxy.cli train ...`
(every machine must see the adapters folder: the helm chart's shared volume; every rank reads the adapter it
resumes from there). Run without torchrun, the trainer is one process with the model unsharded: FSDP would
have nothing to split, and the demo runs the trainer inside another program that has no process group.

Why FSDP rather than a replica per rank: each rank holds 1/N of the base (plus the one or two layers being
computed, gathered just in time), so a model too large for one GPU trains on several, and with CPU offload
(`offload_base`) on few. The LoRA state (adapter, gradients, AdamW moments: a few MB) is sharded alike; the
reduce-scatter of its gradients is the whole of the gradient traffic, the all-gathers of the base the rest.

Roles. Rank 0 is the worker (trainer/worker.py): it claims rollouts, builds transitions, saves and publishes
adapters and serves metrics; it is the only rank that talks to Postgres or the engines. Every other rank runs
`follow()`: it waits for rank 0's next command and runs it on its own shard of the policy. The split earns its
keep: with the base sharded every rank must run every forward pass the trainer makes (a step, the log-probs of
a re-tokenized batch, the gathering of a saved adapter, the load of another), in the same order, and only rank
0 knows what comes next; the followers need no database, engines or ports. Within a step every rank takes its
own share of every mini-batch; each rank's loss is already divided by the token count of the whole mini-batch,
so the summed gradients are the single-process gradient (tests/test_parallel.py checks this against one
process). A rank that dies stops the job: torchrun ends the others, and an adapter is only ever published by
rank 0's atomic rename after every rank has handed over its shard.
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
    """What PolicyTrainer needs from its peers. This default is a single process: nothing to exchange, no shards."""

    rank = 0
    world_size = 1
    local_rank = 0
    device = torch.device("cpu")
    sharded = False  # whether the model is split over the process group's ranks (trainer/sharding.py)

    def sum_(self, tensor: torch.Tensor) -> None:
        """Sum `tensor` over all ranks, in place."""

    def max(self, value: float) -> float:
        return value

    def send(self, message: Any) -> Any:
        """Rank 0: hand a picklable message to every other rank. Others: receive it (pass None)."""
        return message


class TorchCollective(Collective):
    """torch.distributed's default process group (set up by `init_from_environment`); the model is sharded over it."""

    sharded = True

    def __init__(self, rank: int, world_size: int, local_rank: int, device: torch.device) -> None:
        self.rank, self.world_size, self.local_rank, self.device = rank, world_size, local_rank, device

    def sum_(self, tensor: torch.Tensor) -> None:
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)

    def max(self, value: float) -> float:
        box = torch.tensor([value], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(box, op=torch.distributed.ReduceOp.MAX)
        return float(box.item())

    def send(self, message: Any) -> Any:
        box = [message]
        torch.distributed.broadcast_object_list(box, src=0, device=self.device)
        return box[0]


def launched_by_torchrun() -> bool:
    """Whether torchrun started this process (it sets TORCHELASTIC_RUN_ID; also for one rank)."""
    return "TORCHELASTIC_RUN_ID" in os.environ or int(os.environ.get("WORLD_SIZE", "1")) > 1


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
    """Rank 0's policy: a PolicyTrainer whose every computing call also runs on every other rank."""

    def __init__(self, policy, collective: Collective) -> None:
        self.policy = policy
        self.collective = collective

    @classmethod
    def start(cls, build, adapter_dir, collective: Collective) -> "LeaderPolicy":
        """Build rank 0's part (`build(adapter_dir)`) after telling the others to build theirs."""
        collective.send(("start", (adapter_dir,)))
        return cls(build(adapter_dir), collective)

    def step(self, transitions, served_version=None, updates=None, lr_scale=1.0):
        return self._everywhere("step", transitions, served_version, updates, lr_scale)

    def load(self, adapter_dir) -> None:
        self._everywhere("load", adapter_dir)

    def save_adapter(self, target_dir):
        return self._everywhere("save_adapter", target_dir)

    def logprobs(self, transitions, adapter: bool = True):
        return self._everywhere("logprobs", transitions, adapter)

    def close(self) -> None:
        self.collective.send(("stop", ()))

    def _everywhere(self, command: str, *args):
        self.collective.send((command, args))
        return getattr(self.policy, command)(*args)

    def __getattr__(self, name: str):  # config, step_count, ...: rank 0's part alone
        return getattr(self.policy, name)


FOLLOWED = ("step", "load", "save_adapter", "logprobs")  # what LeaderPolicy runs everywhere


def follow(build, collective: Collective) -> int:
    """A rank other than 0: build the policy when told, then run rank 0's commands until it stops.
    Returns the number of steps taken."""
    policy, steps = None, 0
    while True:
        command, args = collective.send(None)
        if command == "start":
            policy = build(*args)
        elif command in FOLLOWED:
            try:
                getattr(policy, command)(*args)
            except Exception:
                log.exception("rank %d: %s failed; every rank stops (rank 0 notes it on the batch), and the "
                              "restarted trainer sets a batch aside after two such tries", collective.rank, command)
                raise
            steps += command == "step"
        elif command == "stop":
            log.info("rank %d: stopped after %d steps", collective.rank, steps)
            return steps
        else:
            raise RuntimeError(f"rank {collective.rank}: unknown command {command!r} from rank 0")
