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
process). A rank that dies stops the job: torchrun ends the others on its machine, and an adapter is only ever
published by rank 0's atomic rename after every rank has handed over its shard.

Timeouts. Rank 0's commands go over a separate gloo (CPU) group with a long timeout: waiting for work is normal,
and an idle follower waits on a socket, not in a device kernel. Everything inside a step runs on the default
group (NCCL on GPUs) under `collective_timeout_s` (minutes). Peers on other machines are watched through the
rendezvous store (trainer/liveness.py): a rank not heard from within that timeout, idle or mid-step, makes the
survivors exit with a message naming it.
"""
from __future__ import annotations

import datetime
import logging
import os
from typing import Any

import torch

from trainer.liveness import EXIT_PEER_LOST, Heartbeat, exit_for_lost_peer, peer_lost, watch_peers

log = logging.getLogger("rlproxy.trainer")

# Followers wait for rank 0's next command while it polls for work, possibly for hours: the command group's
# timeout. A dead peer is noticed by trainer/liveness.py's watch, not by this timeout.
IDLE_TIMEOUT = datetime.timedelta(days=7)
COLLECTIVE_TIMEOUT_S = 300.0  # TrainerSettings.collective_timeout_s' default


class Collective:
    """What PolicyTrainer needs from its peers. This default is a single process: nothing to exchange, no shards."""

    rank = 0
    world_size = 1
    local_rank = 0
    device = torch.device("cpu")
    sharded = False  # whether the model is split over the process group's ranks (trainer/sharding.py)
    heartbeat = Heartbeat(None, 0)  # this rank's liveness file (trainer/liveness.py); none by default

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

    def __init__(self, rank: int, world_size: int, local_rank: int, device: torch.device, commands=None,
                 heartbeat: Heartbeat | None = None) -> None:
        self.rank, self.world_size, self.local_rank, self.device = rank, world_size, local_rank, device
        self.commands = commands  # the gloo group rank 0's commands go over (None: the default group)
        self.heartbeat = heartbeat or Heartbeat(None, rank)

    def sum_(self, tensor: torch.Tensor) -> None:
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)

    def max(self, value: float) -> float:
        box = torch.tensor([value], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(box, op=torch.distributed.ReduceOp.MAX)
        return float(box.item())

    def send(self, message: Any) -> Any:
        box = [message]
        if self.commands is None:
            torch.distributed.broadcast_object_list(box, src=0, device=self.device)
        else:  # on the CPU: an idle follower spins no device kernel
            torch.distributed.broadcast_object_list(box, src=0, group=self.commands, device=torch.device("cpu"))
        return box[0]


def launched_by_torchrun() -> bool:
    """Whether torchrun started this process (it sets TORCHELASTIC_RUN_ID; also for one rank)."""
    return "TORCHELASTIC_RUN_ID" in os.environ or int(os.environ.get("WORLD_SIZE", "1")) > 1


def init_from_environment(collective_timeout_s: float = COLLECTIVE_TIMEOUT_S,
                          heartbeat_dir: os.PathLike | None = None) -> TorchCollective:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR, ...): NCCL on GPUs, else gloo,
    each collective bounded by `collective_timeout_s`; plus the gloo group for rank 0's commands, and the watch
    on the peers (trainer/liveness.py), with this rank's heartbeat file in `heartbeat_dir`."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    torch.distributed.init_process_group(backend=backend,
                                         timeout=datetime.timedelta(seconds=collective_timeout_s))
    commands = torch.distributed.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
    rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
    heartbeat = Heartbeat(heartbeat_dir, rank)
    if world_size > 1:
        watch_peers(rank, world_size, collective_timeout_s, heartbeat)
    collective = TorchCollective(rank=rank, world_size=world_size, local_rank=local_rank, device=device,
                                 commands=commands, heartbeat=heartbeat)
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
        try:
            return getattr(self.policy, command)(*args)
        except Exception as exc:
            if peer_lost(exc):  # not the batch's fault: said so, not noted on it
                exit_for_lost_peer(self.collective.rank, command, exc)
            raise

    def __getattr__(self, name: str):  # config, step_count, ...: rank 0's part alone
        return getattr(self.policy, name)


FOLLOWED = ("step", "load", "save_adapter", "logprobs")  # what LeaderPolicy runs everywhere


def follow(build, collective: Collective) -> int:
    """A rank other than 0: build the policy when told, then run rank 0's commands until it stops.
    Returns the number of steps taken."""
    policy, steps = None, 0
    while True:
        collective.heartbeat.waiting = True
        try:
            command, args = collective.send(None)
        except RuntimeError as exc:  # the command group's peer went away (rank 0 died): no command will come
            log.error("ALERT: rank %d: lost rank 0 while waiting for its next command (%s); exiting so that the "
                      "job starts again (torchrun, the chart)", collective.rank, exc)
            raise SystemExit(EXIT_PEER_LOST) from None
        finally:
            collective.heartbeat.waiting = False
        collective.heartbeat.beat()
        if command == "start":
            policy = build(*args)
        elif command in FOLLOWED:
            try:
                getattr(policy, command)(*args)
            except Exception as exc:
                if peer_lost(exc):
                    exit_for_lost_peer(collective.rank, command, exc)
                log.exception("rank %d: %s failed; every rank stops (rank 0 notes it on the batch), and the "
                              "restarted trainer sets a batch aside after two such tries", collective.rank, command)
                raise
            steps += command == "step"
            collective.heartbeat.beat()
        elif command == "stop":
            log.info("rank %d: stopped after %d steps", collective.rank, steps)
            return steps
        else:
            raise RuntimeError(f"rank {collective.rank}: unknown command {command!r} from rank 0")
