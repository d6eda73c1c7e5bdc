"""LoRA PPO on recorded transitions, built on OpenRLHF's Actor and PolicyLoss.

One step = for each micro-batch: (optionally) base-model log-probs with the adapter disabled, policy
log-probs with it enabled, PPO clipped loss, plus an optional KL penalty to the base model; gradients are
accumulated over the micro-batches of a mini-batch as a mean over its trained tokens, then one clipped
AdamW update of the LoRA parameters per mini-batch (`mini_batches` updates per epoch, `ppo_epochs` epochs).

Decoupled PPO (`proximal_policy=recomputed`, docs/learning.md): the PPO ratio is taken against the proximal
policy, the trainer's own log-probs of the batch before the step's first update (for the first mini-batch the
detached log-probs of its own forward pass; for the others one no-grad pass before that update), so the clip
bounds only how far this step moves the policy. The log-probs the engine recorded while sampling enter only
as an importance weight proximal / behaviour, through OpenRLHF's PolicyLoss correction (`is_correction_*`):
how stale the call is and how the engine's numerics differ from the trainer's, clipped or masked.

Model: OpenRLHF's Actor loads the base in bfloat16 (its only CPU-usable choice, and what vLLM serves)
and wraps it with peft LoRA; peft keeps the LoRA weights in float32, so AdamW updates full-precision
master weights. The reference policy is the same module with the adapter disabled: no second copy.
Log-probs come from trainer/logprobs.py rather than Actor.forward, which runs the LM head over every
position in one piece: only completion positions reach the vocabulary projection, a chunk of rows at a
time, so no [tokens x vocabulary] tensor is ever held.

Several ranks (trainer/parallel.py): the base is sharded over them with FSDP2 (trainer/sharding.py), the
scoring module (`Scorer`) being the root unit; each rank computes its share of every mini-batch, and the same
code runs unsharded in a single process.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import re
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from core.hardware import fast_bf16
from core.settings import TrainingSettings
from trainer.adapter import load_adapter, save_adapter_atomically
from trainer.compat import import_openrlhf
from trainer.loading import check_device_memory, checkpoint_parameters, load_actor, load_sharded_actor
from trainer.logprobs import MicroBatch, Scorer, collate, placeholder_micro_batch
from trainer.lora_targets import resolve_targets
from trainer.memory import activation_checkpointing, release_free_memory, tune_allocator
from trainer.parallel import Collective
from trainer.sharding import decoder_layers, lora_weights, mesh_shape, shard, whole, whole_optimizer_state
from trainer.step_metrics import StepMetrics, StepTally
from trainer.transitions import SkipReasons, Transition, pack_micro_batches, split_by_tokens, validate_transition

log = logging.getLogger(__name__)


class PolicyTrainer:
    """One replica of the policy. With a `collective` of several ranks (trainer/parallel.py), each rank trains
    on its share of every mini-batch and gradients are summed across ranks before each update."""

    def __init__(self, model_path: str | os.PathLike[str], config: TrainingSettings | None = None,
                 adapter_dir: str | os.PathLike[str] | None = None, collective: Collective | None = None) -> None:
        self.config = config = config or TrainingSettings()
        self.model_path = str(model_path)
        self.collective = collective or Collective()
        self.device = (torch.device("cuda", self.collective.local_rank) if torch.cuda.is_available()
                       else torch.device("cpu"))
        if not config.micro_batch_tokens:  # 0: by device (core/settings/training.py)
            budget = 4096 if self.device.type == "cuda" else 384
            self.config = config = replace(config, micro_batch_tokens=budget)
        tune_allocator()  # before the model loads: trainer/memory.py
        replicas, shards = self._mesh() if self.collective.sharded else (1, 1)
        check_device_memory(self.device, self.model_path, shards)
        parts = import_openrlhf()
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        torch.manual_seed(config.seed)  # LoRA A is initialised randomly
        self.autocast_enabled = config.bf16 and fast_bf16()
        lora = {"rank": config.lora_rank, "alpha": config.lora_alpha, "dropout": config.lora_dropout,
                "target_modules": lora_targets(self.model_path, config)}
        if self.collective.sharded:  # each rank reads only its shard of the base (trainer/loading.py)
            def sharded_scorer(model: torch.nn.Module) -> Scorer:
                scorer = Scorer(model)  # FSDP's root unit; LoRA A drawn alike on every rank (same seed)
                shard(scorer, decoder_layers(model), self.device, offload=config.offload_base, replicas=replicas)
                return scorer

            shards_on = torch.device("cpu") if config.offload_base else self.device
            self.actor, self.scorer = load_sharded_actor(
                parts, self.model_path, lora=lora, seed=config.seed, device=shards_on, shard=sharded_scorer,
                # float32 where bf16 arithmetic is slow: the checkpoint's own weights, as the engine serves them
                dtype=torch.bfloat16 if self.autocast_enabled else torch.float32)
            self.model = self.actor.model
        else:
            # OpenRLHF loads the weights in bf16 (the precision vLLM serves them in), straight onto the device;
            # where bf16 arithmetic is slow they are then computed on in float32.
            self.actor = load_actor(parts, self.model_path, lora=lora, device=self.device)
            self.model = self.actor.model  # the peft model: adapter save/load and disable_adapter()
            if not self.autocast_enabled:
                self.model.float()
                # The bf16 load rounded the weights; the engine that sampled the behaviour log-probs serves the
                # checkpoint's own float32 ones here, so the importance ratio must be taken against those.
                _restore_checkpoint_weights(self.model, self.model_path)
            self.scorer = Scorer(self.model)  # the policy's forward pass
        # OpenRLHF makes the embeddings require grad (for gradient checkpointing, unused here); that would carry
        # the backward pass down to the embeddings even when only the top layers are adapted.
        if hasattr(self.model, "_require_grads_hook"):
            self.model.disable_input_require_grads()
        self.actor.train()
        self.decoupled = config.proximal_policy == "recomputed"
        self.policy_loss = parts.PolicyLoss(
            clip_eps_low=config.clip_eps_low, clip_eps_high=config.clip_eps_high, token_level_loss=True,
            dual_clip=config.dual_clip or None, policy_loss_type=config.policy_loss_type,
            # against the engine's own log-probs there is nothing left to weigh
            is_correction_level=config.is_correction_level if self.decoupled else "off",
            is_correction_mode=config.is_correction_mode, is_correction_gating=config.is_correction_gating,
            is_correction_threshold=(config.is_correction_low, config.is_correction_high),
        )
        self._approx_kl = parts.compute_approx_kl
        self._masked_mean = parts.masked_mean
        self.params = [p for p in self.actor.parameters() if p.requires_grad]  # sharded ones, if sharded
        # The adapter a policy starts from when it starts from the base model: this draw (from `seed`), kept, so
        # that every policy trained on this model copy starts from it, not from what another policy left in A.
        self._fresh_lora = {name: param.detach().clone() for name, param in self.model.named_parameters()
                            if "lora_A" in name}
        self.optimizer = torch.optim.AdamW(
            self.params, lr=config.learning_rate, weight_decay=config.weight_decay
        )
        self.step_count = 0
        if adapter_dir is not None:
            state = load_adapter(self.model, adapter_dir, self.optimizer)
            self.step_count = int(state.get("step", 0))
        if config.bf16 and not self.autocast_enabled:
            log.info("no fast bfloat16 on this machine: training computes in float32")

    def _mesh(self) -> tuple[int, int]:
        """(whole copies of the base the ranks hold, ranks each copy is sharded over): the `mesh` setting
        (trainer/sharding.py)."""
        world = self.collective.world_size
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        device_bytes = (torch.cuda.get_device_properties(self.device).total_memory
                        if self.device.type == "cuda" else None)
        replicas, shards = mesh_shape(self.config.mesh, world, local_world,
                                      2 * checkpoint_parameters(self.model_path), device_bytes)
        log.info("mesh %s: %d replica(s) of the base, each sharded over %d rank(s)", self.config.mesh, replicas,
                 shards)
        return replicas, shards

    # --- one training step ------------------------------------------------------------------------
    def step(self, transitions: list[Transition], served_version: int | None = None,
             updates: int | None = None, lr_scale: float = 1.0) -> StepMetrics:
        """`ppo_epochs` passes over the batch; each pass one AdamW update per mini-batch, its gradient accumulated
        over the mini-batch's micro-batches. `served_version`: the version this trainer holds now, which sampled
        the calls of that version (lag 0): on those the engine's log-probs and the proximal ones are compared
        (StepMetrics.agreement_kl). `updates`: mini-batches per epoch when not `mini_batches` (a step over a
        backlog of several batches makes as many updates as those batches would have). `lr_scale`: this step's
        learning rate as a share of `learning_rate` (a step over less than a batch moves the policy less)."""
        started = time.perf_counter()
        batch, skipped = valid_transitions(transitions, self.config.max_seq_len)
        if not batch:
            return StepMetrics(skipped=skipped, step=self.step_count)
        for group in self.optimizer.param_groups:  # set every step: a loaded optimizer state keeps its own
            group["lr"] = self.config.learning_rate * lr_scale
            group["weight_decay"] = self.config.weight_decay
        minis = self._mini_batches(batch, served_version, updates or self.config.mini_batches)
        tally = StepTally(trained_tokens=sum(mini.tokens for mini in minis),
                          micro_batches=sum(not mb.placeholder for mini in minis for mb in mini.micro_batches))
        if self.decoupled:  # before any update: the proximal policy of every mini-batch but the first
            for mini in minis[1:]:
                mini.proximal = [self._logprobs(mb) for mb in mini.micro_batches]
        for epoch in range(self.config.ppo_epochs):
            for mini in minis:
                for i, mb in enumerate(mini.micro_batches):
                    self._micro_step(mb, self._reference(mini, i), mini, i, tally, first_epoch=epoch == 0)
                tally.update(self._optimizer_step())
        self.step_count += 1
        release_free_memory()
        return tally.finish(self.collective, epochs=self.config.ppo_epochs, transitions=len(batch), skipped=skipped,
                            step=self.step_count, duration_s=time.perf_counter() - started,
                            served_version=served_version)

    def _mini_batches(self, batch: list[Transition], served_version: int | None, updates: int) -> list[MiniBatch]:
        """`updates` shares of the batch (one optimizer update each), each packed into micro-batches by token
        budget. With several ranks each computes a part of every share, the parts of near-equal tokens
        (`split_by_tokens`); every loss is divided by the trained tokens of the whole share, so gradients summed over
        ranks are the one-process gradient. Every rank runs as many micro-batches as the busiest one (placeholders):
        each pass gathers the sharded layers."""
        cfg, rank, world = self.config, self.collective.rank, self.collective.world_size
        minis = []
        for share in split_mini_batches(batch, updates, seed=cfg.seed + self.step_count):
            packed = [pack_micro_batches(part, cfg.micro_batch_tokens) for part in split_by_tokens(share, world)]
            mine = [collate(group, served_version=served_version, trained_only=True) for group in packed[rank]]
            mine += [placeholder_micro_batch() for _ in range(max(map(len, packed)) - len(mine))]
            minis.append(MiniBatch([mb.to(self.device) for mb in mine],
                                   tokens=float(sum(sum(t.mask()) for t in share)), sequences=float(len(share))))
        return minis

    def _reference(self, mini: MiniBatch, i: int) -> torch.Tensor | None:
        """The base model's log-probs of micro-batch `i` (adapter off; computed once, in the first epoch), or None
        when no KL is wanted."""
        if not self.config.needs_reference:
            return None
        if i == len(mini.references):
            mini.references.append(self._logprobs(mini.micro_batches[i], adapter=False))
        return mini.references[i]

    def _micro_step(self, mb: MicroBatch, reference: torch.Tensor | None, mini: MiniBatch, i: int,
                    tally: StepTally, first_epoch: bool) -> None:
        """Forward and backward of one micro-batch: PPO clipped loss (+ KL to the base model), its gradient added
        to the mini-batch's as a share of the token mean over the whole mini-batch."""
        cfg = self.config
        long = mb.input_ids.numel() > cfg.micro_batch_tokens
        with activation_checkpointing(self.model, cfg.activation_checkpointing or long):
            logprobs, entropy = self._forward(mb)
        proximal = None
        if self.decoupled:
            if i == len(mini.proximal):  # the first mini-batch, first epoch: no update yet, this forward is it
                mini.proximal.append(logprobs.detach())
            proximal = mini.proximal[i]
        policy_loss, clip_fraction, _, _, is_filtered = self.policy_loss(
            logprobs, mb.behaviour_logprobs if proximal is None else proximal, mb.advantages, mb.loss_mask,
            rollout_log_probs=None if proximal is None else mb.behaviour_logprobs, batch_num_tokens=mini.tokens,
            global_batch_size=mini.sequences)
        loss, kl_loss = policy_loss, None
        if reference is not None:
            kl = self._approx_kl(logprobs, reference, kl_estimator=cfg.kl_estimator)
            kl_loss = (kl * mb.loss_mask).sum() / mini.tokens
            if cfg.kl_coef > 0:
                loss = loss + cfg.kl_coef * kl_loss
        loss.backward()
        if mb.placeholder:
            return
        tally.micro_batch(mb, logprobs.detach(), entropy, loss=loss.detach(), policy_loss=policy_loss.detach(),
                          kl_loss=None if kl_loss is None else kl_loss.detach(), clip_fraction=clip_fraction,
                          proximal=proximal, is_filtered=is_filtered, first_epoch=first_epoch)

    def _optimizer_step(self) -> float:
        cfg = self.config
        if cfg.max_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in self.params if p.grad is not None])
        norm = float(whole(norm))  # over every rank's shard of the gradients
        if math.isfinite(norm):
            self.optimizer.step()
        else:
            log.warning("non-finite gradient norm (%s); update skipped", norm)
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    # --- scoring ----------------------------------------------------------------------------------
    def _forward(self, mb: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs [B, K] of the scored tokens and the policy's entropy there (trainer/logprobs.py)."""
        return self.scorer(mb, temperature=self.config.temperature,
                           autocast_dtype=torch.bfloat16 if self.autocast_enabled else None)

    @torch.no_grad()
    def _logprobs(self, mb: MicroBatch, adapter: bool = True) -> torch.Tensor:
        with contextlib.nullcontext() if adapter else self.model.disable_adapter():
            return self._forward(mb)[0]

    def logprobs(self, transitions: list[Transition], adapter: bool = True) -> list[list[float]]:
        """Per-completion-token log-probs under the current policy (or the base model: adapter=False).

        Scored one micro-batch at a time exactly as `step` does, so values match what `step` sees.
        """
        unique = list({id(t): t for t in transitions}.values())
        results: dict[int, list[float]] = {}
        for group in pack_micro_batches(unique, self.config.micro_batch_tokens):
            mb = collate(group).to(self.device)
            scores = self._logprobs(mb, adapter=adapter)
            for row, t in enumerate(group):
                first = len(t.prompt_ids) - 1 - mb.start
                results[id(t)] = scores[row, first: first + len(t.completion_ids)].tolist()
        return [results[id(t)] for t in transitions]

    # --- persistence ------------------------------------------------------------------------------
    def save_adapter(self, target_dir: str | os.PathLike[str]) -> Path:
        """Write the adapter and its AdamW state to `target_dir`, all or nothing. With several ranks every rank
        calls this (the shards are all-gathered: a few MB of LoRA state) and rank 0 writes."""
        weights, optimizer_state = lora_weights(self.model), whole_optimizer_state(self.optimizer)
        if self.collective.rank != 0:
            return Path(target_dir).absolute()
        return save_adapter_atomically(
            self.model,
            optimizer_state,
            target_dir,
            base_model_name_or_path=self.model_path,
            trainer_state={"step": self.step_count, "config": asdict(self.config)},
            weights=weights,
            # a GPU's engines serve bf16 and this trainer computes its LoRA products in it: the replicas read a bf16
            # copy (half the bytes), the float32 master stays beside the optimizer state (trainer/adapter.py)
            serving_dtype=torch.bfloat16 if self.device.type == "cuda" and self.autocast_enabled else None,
        )

    def load(self, adapter_dir: str | os.PathLike[str] | None) -> None:
        """Continue from a saved adapter (with its optimizer state), or from the base model when None: a fresh
        adapter, the one this trainer drew when it was built (from `seed`), as a new policy starts."""
        self.optimizer.state.clear()
        if adapter_dir is not None:
            state = load_adapter(self.model, adapter_dir, self.optimizer)
            self.step_count = int(state.get("step", 0))
            return
        with torch.no_grad():  # the LoRA update is B @ A; with B = 0 the adapter is the identity
            for name, param in self.model.named_parameters():
                if "lora_B" in name:
                    param.zero_()
                elif name in self._fresh_lora:  # A as first drawn: B's first updates go the way a new trainer's go
                    param.copy_(self._fresh_lora[name])
        self.step_count = 0

    def close(self) -> None:
        """Nothing to release in one process (a LeaderPolicy stops its followers here)."""

    def _autocast(self) -> contextlib.AbstractContextManager:
        if not self.autocast_enabled:
            return contextlib.nullcontext()
        return torch.autocast(device_type=_device_type(self.model), dtype=torch.bfloat16)


def _restore_checkpoint_weights(peft_model: torch.nn.Module, model_path: str) -> None:
    """Copy the checkpoint's base weights (float32 safetensors) over the bf16-rounded ones OpenRLHF loaded, one
    tensor at a time (loading a whole file at once would add its size to the peak memory of start-up)."""
    from safetensors import safe_open

    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        log.warning("no safetensors in %s: base weights stay as loaded", model_path)
        return
    base = peft_model.get_base_model()
    own = {name.replace(".base_layer.", "."): param for name, param in base.named_parameters()
           if "lora_" not in name}
    copied = 0
    with torch.no_grad():
        for file in files:
            with safe_open(str(file), framework="pt") as tensors:
                for name in tensors.keys():
                    if name in own and own[name].shape == tuple(tensors.get_slice(name).get_shape()):
                        own[name].copy_(tensors.get_tensor(name).to(own[name].dtype))
                        copied += 1
    if copied == 0:
        raise RuntimeError(f"none of the checkpoint tensors in {model_path} matched the model's parameters")
    log.debug("restored %d checkpoint tensors in float32", copied)


@dataclass
class MiniBatch:
    """One optimizer update's share of the batch: this rank's micro-batches of it."""
    micro_batches: list[MicroBatch]
    tokens: float  # trained tokens of the whole share (every rank's): each micro-batch's loss divisor
    sequences: float = 0.0  # transitions of the whole share: the divisor of a loss per sequence (gspo)
    references: list[torch.Tensor] = field(default_factory=list)  # base-model log-probs, per micro-batch
    proximal: list[torch.Tensor] = field(default_factory=list)  # log-probs before the step's first update


def valid_transitions(transitions: list[Transition], max_seq_len: int) -> tuple[list[Transition], dict[str, int]]:
    """The transitions a step can train on, and why the others cannot (reason -> count)."""
    skipped = SkipReasons()
    batch = []
    for t in transitions:
        reason = validate_transition(t, max_seq_len)
        if reason is None:
            batch.append(t)
        else:
            skipped[reason] += 1
    return batch, dict(skipped)


def split_mini_batches(batch: list[Transition], count: int, seed: int) -> list[list[Transition]]:
    """`count` shares of near-equal size (fewer if there are fewer transitions), shuffled with `seed` so an
    update does not see one task group only."""
    order = list(batch)
    random.Random(seed).shuffle(order)
    count = max(1, min(count, len(order)))
    return [order[i::count] for i in range(count)]


def _device_type(model: torch.nn.Module) -> str:
    return next(model.parameters()).device.type


def lora_targets(model_path: str, config: TrainingSettings) -> list[str] | str:
    """What LoRA adapts: the module names, or with `lora_layers` a pattern (peft matches a string as a full
    regex) limited to the top layers. vLLM loads such adapters as usual: it goes by the saved tensors."""
    targets = resolve_targets(model_path, list(config.target_modules))  # by the architecture's own names
    if not config.lora_layers:
        return targets
    from transformers import AutoConfig

    total = AutoConfig.from_pretrained(model_path).num_hidden_layers
    layers = "|".join(str(i) for i in range(max(0, total - config.lora_layers), total))
    modules = "|".join(re.escape(m) for m in targets)
    return rf"(?:.*\.)?layers\.(?:{layers})\.(?:.*\.)?(?:{modules})"

