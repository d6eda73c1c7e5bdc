"""What one PPO step reports (core/step_record.py StepMetrics), and the collector that adds it up over
micro-batches, updates, epochs and ranks.

    tally = StepTally(trained_tokens, micro_batches)
    tally.micro_batch(mb, logprobs, entropy, loss=..., policy_loss=..., kl_loss=..., clip_fraction=...)
    tally.update(grad_norm)                       # after each optimizer step
    metrics = tally.finish(collective, epochs=..., ...)

Losses are summed per update (each micro-batch's loss is already divided by its mini-batch's trained tokens) and
averaged over updates; token statistics (clip fraction, ratios, entropy) are weighted by trained tokens over the
whole batch and averaged over epochs. With several ranks every rank adds up its own micro-batches and `finish`
sums them, so the numbers are those of one process computing the whole batch.
"""
from __future__ import annotations

import torch

from core.step_record import StepMetrics
from trainer.logprobs import MicroBatch

SUMMED = ("loss", "policy_loss", "kl", "clip_fraction", "ratio_mean", "behaviour_kl", "entropy", "tokens",
          "micro_batches", "is_weight_mean", "is_filtered", "off_policy_kl", "agreement_kl", "agreement_abs",
          "agreement_tokens")


class StepTally:
    def __init__(self, trained_tokens: float, micro_batches: int) -> None:
        self.trained_tokens = trained_tokens  # of the whole batch, every rank's share: the token weights' divisor
        self.sums: dict[str, float] = {"micro_batches": float(micro_batches)}
        self.ratio_max = 0.0
        self.is_weight_max = 0.0
        self.grad_norms: list[float] = []

    def add(self, name: str, value: torch.Tensor | float, weight: float = 1.0) -> None:
        self.sums[name] = self.sums.get(name, 0.0) + float(value) * weight

    @torch.no_grad()
    def micro_batch(self, mb: MicroBatch, logprobs: torch.Tensor, entropy: torch.Tensor, *, loss: torch.Tensor,
                    policy_loss: torch.Tensor, kl_loss: torch.Tensor | None, clip_fraction: float,
                    proximal: torch.Tensor | None = None, is_filtered: torch.Tensor | None = None,
                    first_epoch: bool = True) -> None:
        whole = self.trained_tokens
        share = float(mb.loss_mask.sum()) / whole
        if kl_loss is not None:
            self.add("kl", kl_loss)
        self.add("loss", loss)
        self.add("policy_loss", policy_loss)
        self.add("clip_fraction", clip_fraction, share)
        log_ratio = (logprobs - (mb.behaviour_logprobs if proximal is None else proximal)) * mb.loss_mask
        self.add("ratio_mean", (log_ratio.exp() * mb.loss_mask).sum() / whole)
        self.add("behaviour_kl", -((logprobs - mb.behaviour_logprobs) * mb.loss_mask).sum() / whole)
        self.ratio_max = max(self.ratio_max, _masked_max(log_ratio, mb.loss_mask))
        self.add("entropy", (entropy * mb.loss_mask).sum() / whole)
        self.add("tokens", mb.tokens)
        if proximal is not None:
            weight = (proximal - mb.behaviour_logprobs) * mb.loss_mask  # log(proximal / behaviour)
            self.add("off_policy_kl", -weight.sum() / whole)
            self.add("is_weight_mean", (weight.exp() * mb.loss_mask).sum() / whole)
            self.is_weight_max = max(self.is_weight_max, _masked_max(weight, mb.loss_mask))
            if is_filtered is not None:
                self.add("is_filtered", is_filtered, share)
            if first_epoch and mb.served is not None and float(mb.served.sum()) > 0:
                self.served(mb.served, proximal, mb.behaviour_logprobs)

    def served(self, mask: torch.Tensor, trainer: torch.Tensor, engine: torch.Tensor) -> None:
        """Sums for the agreement of engine and trainer on tokens sampled by the version the trainer holds:
        KL(engine || trainer) per token by the k3 estimator (r - 1 - log r, r = trainer / engine, on tokens the
        engine sampled: never negative, low variance), and the mean absolute log-prob difference."""
        log_r = (trainer - engine) * mask
        self.add("agreement_kl", ((log_r.exp() - 1 - log_r) * mask).sum())
        self.add("agreement_abs", log_r.abs().sum())
        self.add("agreement_tokens", mask.sum())

    def update(self, grad_norm: float) -> None:
        self.grad_norms.append(grad_norm)

    def finish(self, collective, *, epochs: int, transitions: int, skipped: dict[str, int], step: int,
               duration_s: float, served_version: int | None = None) -> StepMetrics:
        """The step's metrics, every rank's micro-batches counted (a collective: every rank calls it)."""
        sums = self._sum_over_ranks(collective)
        agreement_tokens = sums.get("agreement_tokens", 0.0)
        updates = len(self.grad_norms)
        tokens = int(sums["tokens"])
        return StepMetrics(
            loss=sums["loss"] / updates,
            policy_loss=sums["policy_loss"] / updates,
            kl=sums["kl"] / updates if "kl" in sums else None,
            clip_fraction=sums["clip_fraction"] / epochs,
            ratio_mean=sums["ratio_mean"] / epochs,
            ratio_max=collective.max(self.ratio_max),
            behaviour_kl=sums["behaviour_kl"] / epochs,
            off_policy_kl=sums.get("off_policy_kl", 0.0) / epochs,
            is_weight_mean=sums["is_weight_mean"] / epochs if "is_weight_mean" in sums else 1.0,
            is_weight_max=collective.max(self.is_weight_max) if "is_weight_mean" in sums else 1.0,
            is_filtered=sums.get("is_filtered", 0.0) / epochs,
            served_version=served_version,
            agreement_kl=sums["agreement_kl"] / agreement_tokens if agreement_tokens else None,
            agreement_abs=sums["agreement_abs"] / agreement_tokens if agreement_tokens else None,
            agreement_tokens=int(agreement_tokens),
            entropy=sums["entropy"] / epochs,
            grad_norm=sum(self.grad_norms) / updates,
            transitions=transitions,
            micro_batches=int(sums["micro_batches"]),
            updates=updates,
            tokens=tokens,
            trained_tokens=int(self.trained_tokens),
            tokens_per_s=tokens / duration_s,
            duration_s=duration_s,
            step=step,
            skipped=skipped,
        )

    def _sum_over_ranks(self, collective) -> dict[str, float]:
        """Every rank's sums added up (a name a rank never saw counts 0 there; absent if no rank saw it)."""
        if collective.world_size == 1:
            return self.sums
        values = torch.tensor([self.sums.get(n, 0.0) for n in SUMMED] + [float(n in self.sums) for n in SUMMED],
                              dtype=torch.float64, device=collective.device)
        collective.sum_(values)
        return {n: float(values[i]) for i, n in enumerate(SUMMED) if values[len(SUMMED) + i] > 0}


def _masked_max(log_values: torch.Tensor, mask: torch.Tensor) -> float:
    """The largest exp(value) where mask is 1."""
    return float(log_values.masked_fill(mask == 0, -1e9).exp().max())
