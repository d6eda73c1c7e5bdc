"""The engine's top-k / top-p truncation, applied to the trainer's own logits (already divided by the temperature).

vLLM samples a call with top_k / top_p from the tempered distribution restricted to the kept tokens and
renormalised over them (vllm/v1/sample/ops/topk_topp_sampler.py: top-k first, then top-p over what top-k kept;
a token tied with the k-th is kept; top-p keeps the fewest most probable tokens whose mass reaches p, at least
one). With `--logprobs-mode processed_logprobs` the recorded log-prob is that renormalised one, so the trainer
computes the same: dropped tokens get -inf and logsumexp runs over the kept ones. The sampled token itself is
always kept: at lag 0 the engine kept it, and once the policy has moved a token just outside the trainer's kept
set gets a finite (small) probability instead of -inf, whose ratio and gradient would be undefined.
"""
from __future__ import annotations

import torch


def truncate(z: torch.Tensor, targets: torch.Tensor, top_p: torch.Tensor | None,
             top_k: torch.Tensor | None) -> torch.Tensor:
    """`z` [N, V] with the tokens each row's top_k (0: none) and top_p (1: none) drop set to -inf, in place."""
    vocab = z.shape[1]
    drop = torch.zeros_like(z, dtype=torch.bool)
    if top_k is not None and bool((top_k > 0).any()):
        k = top_k.clamp(min=1, max=vocab).to(torch.long)  # a top_k above the vocabulary keeps it all
        kth = z.topk(int(k.max()), dim=-1).values.gather(1, (k - 1)[:, None])
        drop |= (z < kth) & (top_k > 0)[:, None]
    if top_p is not None and bool((top_p < 1).any()):
        p = torch.softmax(z.masked_fill(drop, float("-inf")), dim=-1)  # over what top-k kept
        ordered, order = p.sort(dim=-1, descending=True)
        before = ordered.cumsum(-1) - ordered  # the mass of the tokens more probable than each
        dropped = (before >= top_p[:, None]) & (top_p < 1)[:, None]
        dropped[:, 0] = False
        drop |= torch.zeros_like(drop).scatter_(1, order, dropped)
        del p, ordered, order, before, dropped
    drop.scatter_(1, targets[:, None], False)
    return z.masked_fill_(drop, float("-inf"))
