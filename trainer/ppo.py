"""LoRA PPO on recorded transitions, built on OpenRLHF's Actor and PolicyLoss.

One step = for each micro-batch: (optionally) base-model log-probs with the adapter disabled, policy
log-probs with it enabled, PPO clipped loss with the importance ratio taken against the behaviour
log-probs vLLM recorded while sampling, plus an optional KL penalty to the base model; gradients are
accumulated over micro-batches as a mean over all trained tokens of the step; then one clipped AdamW
update of the LoRA parameters.

Model: OpenRLHF's Actor loads the base in bfloat16 (its only CPU-usable choice, and what vLLM serves)
and wraps it with peft LoRA; peft keeps the LoRA weights in float32, so AdamW updates full-precision
master weights. The reference policy is the same module with the adapter disabled: no second copy.
Log-probs come from `_forward` rather than Actor.forward, which runs the LM head over every position;
ours skips the prompt positions (the same padded path otherwise).
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlproxy.hardware import fast_bf16
from trainer.adapter import load_adapter, save_adapter_atomically
from trainer.compat import import_openrlhf
from trainer.config import TrainConfig
from trainer.transitions import SkipReasons, Transition, pack_micro_batches, validate_transition

log = logging.getLogger(__name__)


@dataclass
class StepMetrics:
    loss: float = 0.0
    policy_loss: float = 0.0
    kl: float | None = None  # KL(policy || base) per trained token; None when the reference pass is off
    clip_fraction: float = 0.0
    ratio_mean: float = 1.0  # importance ratio policy / behaviour over trained tokens
    ratio_max: float = 1.0
    behaviour_kl: float = 0.0  # mean(behaviour logp - policy logp): how off-policy the batch is
    entropy: float = 0.0
    grad_norm: float = 0.0
    transitions: int = 0
    micro_batches: int = 0
    tokens: int = 0  # prompt + completion tokens through the model (all epochs)
    trained_tokens: int = 0  # model-sampled tokens in the loss (one epoch)
    tokens_per_s: float = 0.0
    duration_s: float = 0.0
    step: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _MicroBatch:
    """Right-padded sequences. Per-token tensors cover log-prob positions start .. T-2 (position j scores
    token j + 1): from the earliest completion in the batch on, so prompt-only positions never reach the
    vocabulary projection."""

    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    start: int
    loss_mask: torch.Tensor  # [B, K] 1 where the scored token was sampled by the model; K = T - 1 - start
    behaviour_logprobs: torch.Tensor  # [B, K]
    advantages: torch.Tensor  # [B, K]
    tokens: int


def collate(transitions: list[Transition], pad_id: int = 0) -> _MicroBatch:
    rows = len(transitions)
    width = max(len(t) for t in transitions)
    start = min(len(t.prompt_ids) for t in transitions) - 1
    ids = torch.full((rows, width), pad_id, dtype=torch.long)
    attention = torch.zeros((rows, width), dtype=torch.long)
    mask, behaviour, advantages = (torch.zeros((rows, width - 1 - start)) for _ in range(3))
    for i, t in enumerate(transitions):
        seq = t.prompt_ids + t.completion_ids
        ids[i, : len(seq)] = torch.tensor(seq)
        attention[i, : len(seq)] = 1
        span = slice(len(t.prompt_ids) - 1 - start, len(seq) - 1 - start)  # this row's completion tokens
        mask[i, span] = torch.tensor(t.mask(), dtype=torch.float32)
        behaviour[i, span] = torch.tensor(t.behaviour_logprobs, dtype=torch.float32)
        advantages[i, span] = torch.tensor(t.advantages(), dtype=torch.float32) * mask[i, span]
    return _MicroBatch(ids, attention, start, mask, behaviour, advantages, int(attention.sum()))


class PolicyTrainer:
    def __init__(self, model_path: str | os.PathLike[str], config: TrainConfig | None = None,
                 adapter_dir: str | os.PathLike[str] | None = None) -> None:
        self.config = config = config or TrainConfig()
        self.model_path = str(model_path)
        parts = import_openrlhf()
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        torch.manual_seed(config.seed)  # LoRA A is initialised randomly
        self.autocast_enabled = config.bf16 and fast_bf16()
        # OpenRLHF loads the weights in bf16 (the precision vLLM serves them in); where bf16 arithmetic is
        # slow they are then computed on in float32.
        self.actor = parts.Actor(
            self.model_path,
            attn_implementation="sdpa",
            param_dtype="bf16",
            lora_rank=config.lora_rank,
            lora_alpha=config.lora_alpha,
            lora_dropout=config.lora_dropout,
            target_modules=lora_targets(self.model_path, config),
        )
        self.model = self.actor.model  # the peft model: adapter save/load and disable_adapter()
        # OpenRLHF makes the embeddings require grad (for gradient checkpointing, unused here); that would carry
        # the backward pass down to the embeddings even when only the top layers are adapted.
        self.model.disable_input_require_grads()
        if not self.autocast_enabled:
            self.model.float()
        self.actor.train()
        self.policy_loss = parts.PolicyLoss(
            clip_eps_low=config.clip_eps_low, clip_eps_high=config.clip_eps_high, token_level_loss=True
        )
        self._approx_kl = parts.compute_approx_kl
        self._masked_mean = parts.masked_mean
        self.params = [p for p in self.actor.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=config.learning_rate, weight_decay=config.weight_decay
        )
        self.step_count = 0
        if adapter_dir is not None:
            state = load_adapter(self.model, adapter_dir, self.optimizer)
            self.step_count = int(state.get("step", 0))
        if config.bf16 and not self.autocast_enabled:
            log.info("no fast bfloat16 on this machine: training computes in float32")

    # --- one training step ------------------------------------------------------------------------
    def step(self, transitions: list[Transition]) -> StepMetrics:
        cfg = self.config
        started = time.perf_counter()
        skipped = SkipReasons()
        batch = []
        for t in transitions:
            reason = validate_transition(t, cfg.max_seq_len)
            if reason is None:
                batch.append(t)
            else:
                skipped[reason] += 1
        metrics = StepMetrics(transitions=len(batch), skipped=dict(skipped), step=self.step_count)
        if not batch:
            return metrics
        micro_batches = [collate(mb) for mb in pack_micro_batches(batch, cfg.micro_batch_tokens)]
        trained_tokens = sum(float(mb.loss_mask.sum()) for mb in micro_batches)
        references: list[torch.Tensor | None] = [None] * len(micro_batches)
        sums: dict[str, float] = {}
        grad_norms: list[float] = []
        ratio_max = 0.0

        def add(name: str, value: torch.Tensor | float, weight: float = 1.0) -> None:
            sums[name] = sums.get(name, 0.0) + float(value) * weight

        for _ in range(cfg.ppo_epochs):
            for i, mb in enumerate(micro_batches):
                if cfg.needs_reference and references[i] is None:
                    references[i] = self._logprobs(mb, adapter=False)
                logprobs, logits = self._forward(mb)
                # Token-mean over the whole step: each micro-batch contributes its sum / all trained tokens.
                policy_loss, clip_frac, _, _, _ = self.policy_loss(
                    logprobs, mb.behaviour_logprobs, mb.advantages, mb.loss_mask,
                    batch_num_tokens=trained_tokens,
                )
                loss = policy_loss
                if references[i] is not None:
                    kl = self._approx_kl(logprobs, references[i], kl_estimator=cfg.kl_estimator)
                    kl_loss = (kl * mb.loss_mask).sum() / trained_tokens
                    if cfg.kl_coef > 0:
                        loss = loss + cfg.kl_coef * kl_loss
                    add("kl", kl_loss.detach())
                loss.backward()

                mb_tokens = float(mb.loss_mask.sum())
                add("loss", loss.detach())
                add("policy_loss", policy_loss.detach())
                add("clip_fraction", clip_frac, mb_tokens / trained_tokens)
                with torch.no_grad():
                    log_ratio = (logprobs.detach() - mb.behaviour_logprobs) * mb.loss_mask
                    add("ratio_mean", (log_ratio.exp() * mb.loss_mask).sum() / trained_tokens)
                    add("behaviour_kl", -log_ratio.sum() / trained_tokens)
                    masked = log_ratio.masked_fill(mb.loss_mask == 0, -1e9)
                    ratio_max = max(ratio_max, float(masked.exp().max()))
                    add("entropy", _masked_entropy_sum(logits, mb.loss_mask) / trained_tokens)
                add("tokens", mb.tokens)
                del logits, logprobs, loss

            grad_norms.append(self._optimizer_step())

        self.step_count += 1
        epochs = cfg.ppo_epochs
        duration = time.perf_counter() - started
        metrics.loss = sums["loss"] / epochs
        metrics.policy_loss = sums["policy_loss"] / epochs
        metrics.kl = sums["kl"] / epochs if "kl" in sums else None
        metrics.clip_fraction = sums["clip_fraction"] / epochs
        metrics.ratio_mean = sums["ratio_mean"] / epochs
        metrics.ratio_max = ratio_max
        metrics.behaviour_kl = sums["behaviour_kl"] / epochs
        metrics.entropy = sums["entropy"] / epochs
        metrics.grad_norm = sum(grad_norms) / len(grad_norms)
        metrics.micro_batches = len(micro_batches)
        metrics.tokens = int(sums["tokens"])
        metrics.trained_tokens = int(trained_tokens)
        metrics.duration_s = duration
        metrics.tokens_per_s = metrics.tokens / duration
        metrics.step = self.step_count
        return metrics

    def _optimizer_step(self) -> float:
        cfg = self.config
        if cfg.max_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm)
        else:
            grads = [p.grad.norm() for p in self.params if p.grad is not None]
            norm = torch.linalg.vector_norm(torch.stack(grads))
        norm = float(norm)
        if math.isfinite(norm):
            self.optimizer.step()
        else:
            log.warning("non-finite gradient norm (%s); update skipped", norm)
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    # --- scoring ----------------------------------------------------------------------------------
    def _forward(self, mb: _MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs [B, K] of the scored tokens and their logits [B, K, V].

        Actor.forward's padded path, except that only positions from `mb.start` on go through the LM
        head: agent prompts are long and the vocabulary projection + log-softmax of every prompt
        position would be wasted work (HF's `logits_to_keep` takes the positions).
        """
        position_ids = mb.attention_mask.cumsum(-1) - 1
        position_ids.masked_fill_(mb.attention_mask == 0, 1)
        keep = torch.arange(mb.start, mb.input_ids.shape[1] - 1)
        with self._autocast():
            output = self.model(input_ids=mb.input_ids, attention_mask=mb.attention_mask,
                                position_ids=position_ids, logits_to_keep=keep)
        logits = output.logits.float()
        if self.config.temperature != 1.0:
            logits = logits / self.config.temperature
        targets = mb.input_ids[:, mb.start + 1:]
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        return logprobs, logits

    @torch.no_grad()
    def _logprobs(self, mb: _MicroBatch, adapter: bool = True) -> torch.Tensor:
        with contextlib.nullcontext() if adapter else self.model.disable_adapter():
            return self._forward(mb)[0]

    def logprobs(self, transitions: list[Transition], adapter: bool = True) -> list[list[float]]:
        """Per-completion-token log-probs under the current policy (or the base model: adapter=False).

        Scored one micro-batch at a time exactly as `step` does, so values match what `step` sees.
        """
        unique = list({id(t): t for t in transitions}.values())
        results: dict[int, list[float]] = {}
        for group in pack_micro_batches(unique, self.config.micro_batch_tokens):
            mb = collate(group)
            scores = self._logprobs(mb, adapter=adapter)
            for row, t in enumerate(group):
                first = len(t.prompt_ids) - 1 - mb.start
                results[id(t)] = scores[row, first: first + len(t.completion_ids)].tolist()
        return [results[id(t)] for t in transitions]

    # --- persistence ------------------------------------------------------------------------------
    def save_adapter(self, target_dir: str | os.PathLike[str]) -> Path:
        return save_adapter_atomically(
            self.model,
            self.optimizer.state_dict(),
            target_dir,
            base_model_name_or_path=self.model_path,
            trainer_state={"step": self.step_count, "config": asdict(self.config)},
        )

    def load(self, adapter_dir: str | os.PathLike[str] | None) -> None:
        """Continue from a saved adapter (with its optimizer state), or from the base model when None."""
        self.optimizer.state.clear()
        if adapter_dir is not None:
            state = load_adapter(self.model, adapter_dir, self.optimizer)
            self.step_count = int(state.get("step", 0))
            return
        with torch.no_grad():  # the LoRA update is B @ A; with B = 0 the adapter is the identity
            for name, param in self.model.named_parameters():
                if "lora_B" in name:
                    param.zero_()
        self.step_count = 0

    def _autocast(self) -> contextlib.AbstractContextManager:
        if not self.autocast_enabled:
            return contextlib.nullcontext()
        return torch.autocast(device_type=_device_type(self.model), dtype=torch.bfloat16)


def _masked_entropy_sum(logits: torch.Tensor, mask: torch.Tensor, chunk: int = 1024) -> float:
    """Sum of the policy's entropy over trained positions, in chunks to bound memory."""
    rows = logits[mask.bool()]
    total = 0.0
    for start in range(0, rows.shape[0], chunk):
        x = rows[start: start + chunk].float()
        logp = torch.log_softmax(x, dim=-1)
        total += float(-(logp.exp() * logp).sum())
    return total


def _device_type(model: torch.nn.Module) -> str:
    return next(model.parameters()).device.type


def lora_targets(model_path: str, config: TrainConfig) -> list[str] | str:
    """What LoRA adapts: the module names, or with `lora_layers` a pattern (peft matches a string as a full
    regex) limited to the top layers. vLLM loads such adapters as usual: it goes by the saved tensors."""
    if not config.lora_layers:
        return list(config.target_modules)
    from transformers import AutoConfig

    total = AutoConfig.from_pretrained(model_path).num_hidden_layers
    layers = "|".join(str(i) for i in range(max(0, total - config.lora_layers), total))
    modules = "|".join(re.escape(m) for m in config.target_modules)
    return rf"(?:.*\.)?layers\.(?:{layers})\.(?:.*\.)?(?:{modules})"

