"""Per-token log-probs and entropies of recorded completions under a causal LM, without full-vocabulary tensors.

    mb = collate(transitions)                       # right-padded micro-batch
    logprobs, entropy = score(peft_model, mb)       # [B, K] each; zero outside the completions
    Scorer(peft_model)(mb)                          # the same as a module's forward (what FSDP shards as its root)
    token_scores(hidden, head, targets)             # the same from hidden states [N, H] and targets [N]

Only completion positions reach the vocabulary projection: prompts (often most of an agent's tokens) and
padding stop at the last hidden state. A training step goes further (`collate(..., trained_only=True)`): only the
positions its loss reads (loss mask 1) are projected, so the context a merged multi-turn transition carries between
its sampled spans (tool results, user turns: mask 0) is not projected either; their log-probs are 0, as the loss
and every statistic of the step multiply them by the mask.

The plain way, `log_softmax(head(hidden)).gather(targets)`, holds [N, V] float32 tensors for the whole
micro-batch (logits, log-softmax, and in backward the softmax and the logits' gradient): with the bundled
model's 49,152-token vocabulary that is 200 KB per scored token per tensor, 0.8 GB each for 4,096 tokens.
Here rows go through the vocabulary projection a chunk at a time (`chunk_rows`), so only a few [chunk, V]
tensors exist at any time, and none outlives its chunk. On a CPU a chunk's float32 logits stay near 32 MB (170 rows
of the bundled model's vocabulary), which fits the caches; on a GPU the chunk is sized by the device's free memory
(an eighth of it for the chunk's few [chunk, V] tensors, up to 4,096 rows): 55 rows of Qwen3's 151,936-token
vocabulary were a memory-bound sliver of a matmul, a device with 30 GB free takes about 2,000 of them.

Backward needs no second vocabulary projection. For logits z = h W^T / T and log p_t = z_t - logsumexp(z),

    d log p_t / d h = (W_t - sum_v p_v W_v) / T,

so forward keeps E = p W ([N, H], the probability-weighted mean output embedding) next to each chunk's
log-probs, and backward is elementwise. That costs one [chunk, V] x [V, H] product per chunk, the same
work autograd's backward of the plain way does, and saves nothing of size V. When the head itself is trained
(its weight requires grad, or it is not a plain linear layer, e.g. a LoRA-wrapped head), each chunk is
instead recomputed in backward (activation checkpointing): the same bound on memory, one more projection.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from trainer.transitions import Transition
from trainer.truncation import truncate

# Rows per chunk on a CPU: the [rows, V] float32 logits stay near 32 MB (170 rows for a 49k vocabulary): small
# next to the model, large enough that the projection runs at full matmul speed (bench/lm_head.py).
CHUNK_ELEMENTS = 1 << 23
# On a GPU: a chunk's live [rows, V] tensors (the bf16 product, float32 log-probs and probabilities, their bf16 cast:
# about 12 bytes an element) take at most this share of the device's free memory, within these rows.
DEVICE_SHARE = 8
BYTES_PER_ELEMENT = 12
MAX_ROWS = 4096


@dataclass
class MicroBatch:
    """Right-padded sequences. Per-token tensors cover log-prob positions start .. T-2 (position j scores
    token j + 1): from the earliest completion in the batch on, so earlier positions are never scored."""

    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    start: int
    scored: torch.Tensor  # [B, K] True where the scored token is a completion token; K = T - 1 - start
    loss_mask: torch.Tensor  # [B, K] 1 where the scored token was sampled by the model
    behaviour_logprobs: torch.Tensor  # [B, K]
    advantages: torch.Tensor  # [B, K]
    tokens: int
    placeholder: bool = False  # nothing to learn from: keeps a rank with less work in step with the others
    # [B, K] the loss mask of rows sampled by the version the trainer holds (lag 0), or None: where the engine's
    # log-probs and the trainer's must agree (trainer/agreement.py)
    served: torch.Tensor | None = None
    # [B, K] the positions that go through the vocabulary projection, or None: every scored one. A training step's
    # micro-batches project only the trained positions (collate's `trained_only`).
    projected: torch.Tensor | None = None
    # [B] each row's sampling as its call was sampled (Transition.sampled), or None when every row was sampled at
    # temperature 1 from the whole vocabulary: temperature (NaN: the scorer's default), top_p (1: none), top_k
    # (0: none). One micro-batch may hold several.
    temperature: torch.Tensor | None = None
    top_p: torch.Tensor | None = None
    top_k: torch.Tensor | None = None

    def to(self, device: torch.device) -> "MicroBatch":
        if device.type == "cpu":
            return self
        move = {name: getattr(self, name).to(device) for name in
                ("input_ids", "attention_mask", "scored", "loss_mask", "behaviour_logprobs", "advantages")}
        optional = {name: None if getattr(self, name) is None else getattr(self, name).to(device)
                    for name in ("served", "projected", "temperature", "top_p", "top_k")}
        return MicroBatch(**move, start=self.start, tokens=self.tokens, placeholder=self.placeholder, **optional)


def collate(transitions: list[Transition], pad_id: int = 0, served_version: int | None = None,
            trained_only: bool = False) -> MicroBatch:
    """`served_version`: mark the rows that version sampled (their oldest call's version: `MicroBatch.served`).
    `trained_only`: project only the positions the loss trains (`MicroBatch.projected`); the others score 0."""
    rows = len(transitions)
    width = max(len(t) for t in transitions)
    start = min(len(t.prompt_ids) for t in transitions) - 1
    ids = torch.full((rows, width), pad_id, dtype=torch.long)
    attention = torch.zeros((rows, width), dtype=torch.long)
    scored = torch.zeros((rows, width - 1 - start), dtype=torch.bool)
    mask, behaviour, advantages = (torch.zeros((rows, width - 1 - start)) for _ in range(3))
    for i, t in enumerate(transitions):
        seq = t.prompt_ids + t.completion_ids
        ids[i, : len(seq)] = torch.tensor(seq)
        attention[i, : len(seq)] = 1
        span = slice(len(t.prompt_ids) - 1 - start, len(seq) - 1 - start)  # this row's completion tokens
        scored[i, span] = True
        mask[i, span] = torch.tensor(t.mask(), dtype=torch.float32)
        behaviour[i, span] = torch.tensor(t.behaviour_logprobs, dtype=torch.float32)
        advantages[i, span] = torch.tensor(t.advantages(), dtype=torch.float32) * mask[i, span]
    served = None
    if served_version is not None:
        fresh = torch.tensor([float(t.policy_version == served_version) for t in transitions]).unsqueeze(1)
        served = mask * fresh
    mb = MicroBatch(ids, attention, start, scored, mask, behaviour, advantages, int(attention.sum()), served=served)
    if trained_only:
        trained = scored & (mask > 0)
        # nothing trained (a placeholder): its scored positions still run, so that every rank's backward reaches
        # the decoder's layers alike (a sharded base reduces their gradients there)
        mb.projected = trained if bool(trained.any()) else scored
    if any(t.sampled is not None for t in transitions):
        sampled = [t.sampled for t in transitions]
        mb.temperature = torch.tensor([float("nan") if s is None else s.temperature for s in sampled])
        mb.top_p = torch.tensor([1.0 if s is None else s.top_p for s in sampled])
        mb.top_k = torch.tensor([0 if s is None else s.top_k for s in sampled], dtype=torch.long)
    return mb


def placeholder_micro_batch() -> MicroBatch:
    """A two-token micro-batch with nothing trained in it (loss mask 0, no tokens counted). With the base sharded,
    every rank must run as many forward and backward passes as the others (each one gathers the layers' shards),
    so a rank whose share packed into fewer micro-batches runs these."""
    mb = collate([Transition([0], [0], [0.0], advantage=0.0, loss_mask=[0])])
    mb.tokens, mb.placeholder = 0, True
    return mb


class Scorer(torch.nn.Module):
    """`score` as the forward of a module holding the peft model. Sharded (trainer/sharding.py), this is FSDP's root
    unit: calling it gathers the embeddings, final norm and LM head for the whole computation (the decoder layers
    gather their own as they run), and they stay whole until backward, which reads the LM head again, ends."""

    def __init__(self, peft_model: torch.nn.Module) -> None:
        super().__init__()
        self.policy = peft_model

    def forward(self, mb: MicroBatch, temperature: float = 1.0,
                autocast_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return score(self.policy, mb, temperature=temperature, autocast_dtype=autocast_dtype)


def score(peft_model: torch.nn.Module, mb: MicroBatch, *, temperature: float = 1.0,
          autocast_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs [B, K] of the scored tokens (differentiable) and the policy's entropy there [B, K]; 0 elsewhere.

    The decoder's last hidden states at the completion positions go through `token_scores`; HF's own
    forward would project every kept position onto the vocabulary in one piece. With `autocast_dtype` the
    decoder and the projection compute in it (bfloat16 on hardware that does it fast).
    """
    base = peft_model.get_base_model()  # LoRA layers are injected in place: its modules are the adapted ones
    position_ids = mb.attention_mask.cumsum(-1) - 1
    position_ids.masked_fill_(mb.attention_mask == 0, 1)
    device = mb.input_ids.device.type
    with torch.autocast(device, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext():
        hidden = base.get_decoder()(input_ids=mb.input_ids, attention_mask=mb.attention_mask,
                                    position_ids=position_ids, use_cache=False).last_hidden_state
    where = mb.scored if mb.projected is None else mb.projected
    targets = mb.input_ids[:, mb.start + 1:][where]
    top_p = top_k = None
    if mb.temperature is not None:  # each token at its own call's sampling
        rows = where.nonzero()[:, 0]
        per_row = torch.where(mb.temperature.isnan(), torch.full_like(mb.temperature, temperature), mb.temperature)
        temperature, top_p, top_k = per_row[rows], mb.top_p[rows], mb.top_k[rows]
    scores = token_scores(hidden[:, mb.start: -1][where], base.get_output_embeddings(), targets,
                          temperature=temperature, compute_dtype=autocast_dtype,
                          softcap=getattr(base.config, "final_logit_softcapping", None), top_p=top_p, top_k=top_k)
    logprobs = torch.zeros(where.shape, dtype=torch.float32, device=where.device)
    entropy = torch.zeros_like(logprobs)
    logprobs[where] = scores.logprobs
    entropy[where] = scores.entropy
    return logprobs, entropy


@dataclass
class TokenScores:
    logprobs: torch.Tensor  # [N] float32, differentiable with respect to the hidden states
    entropy: torch.Tensor  # [N] float32, the policy's entropy at each row; no gradient


def chunk_rows(vocab_size: int, free_bytes: int | None = None) -> int:
    """Rows per chunk of the vocabulary projection: by `free_bytes` of device memory (a GPU's), else the CPU's
    fixed 32 MB of logits."""
    cpu_rows = max(1, CHUNK_ELEMENTS // vocab_size)
    if free_bytes is None:
        return cpu_rows
    return max(cpu_rows, min(MAX_ROWS, free_bytes // (DEVICE_SHARE * BYTES_PER_ELEMENT * vocab_size)))


def device_chunk_rows(vocab_size: int, device: torch.device) -> int:
    """`chunk_rows` for the device the hidden states are on, its free memory read now."""
    if device.type != "cuda":
        return chunk_rows(vocab_size)
    free, _total = torch.cuda.mem_get_info(device)
    return chunk_rows(vocab_size, free)


def token_scores(hidden: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor, *,
                 temperature: float | torch.Tensor = 1.0, compute_dtype: torch.dtype | None = None,
                 softcap: float | None = None, rows: int | None = None, top_p: torch.Tensor | None = None,
                 top_k: torch.Tensor | None = None) -> TokenScores:
    """Log-prob of `targets[i]` after `hidden[i]`, and the entropy there, under logits `head(hidden) / temperature`
    (a number, or one per row [N]), with each row's `top_k` / `top_p` [N] truncation applied and renormalised over
    the kept tokens (trainer/truncation.py) when given.

    `compute_dtype` is the precision of the vocabulary projection (default: the head's weight dtype; pass
    bfloat16 where the model runs under bfloat16 autocast); softmax and everything after it are float32.
    `softcap` is a Gemma-style final logit soft-cap (tanh(z / cap) * cap before the temperature), if the model has one.
    """
    rows = rows or device_chunk_rows(_vocab_size(head), hidden.device)
    weight = getattr(head, "weight", None)
    plain = (type(head) is torch.nn.Linear and head.bias is None and not weight.requires_grad and softcap is None)
    if plain:
        logprobs, entropy = _ProjectedLogprobs.apply(hidden, weight, targets, temperature,
                                                     compute_dtype or weight.dtype, rows, top_p, top_k)
        return TokenScores(logprobs, entropy)
    pieces = []
    for start in range(0, hidden.shape[0], rows):
        piece = slice(start, start + rows)
        args = (hidden[piece], targets[piece], head, _rows_of(temperature, piece), softcap,
                _rows_of(top_p, piece), _rows_of(top_k, piece))
        pieces.append(checkpoint(_chunk_scores, *args, use_reentrant=False) if torch.is_grad_enabled()
                      else _chunk_scores(*args))
    if not pieces:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return TokenScores(empty, empty)
    return TokenScores(torch.cat([p[0] for p in pieces]), torch.cat([p[1] for p in pieces]).detach())


def _vocab_size(head: torch.nn.Module) -> int:
    weight = getattr(head, "weight", None)
    if weight is None:  # e.g. a peft wrapper: the wrapped layer holds the weight
        weight = head.get_base_layer().weight
    return weight.shape[0]


def _rows_of(value, piece: slice):
    """A per-row tensor's rows of one chunk (a number as it is)."""
    return value[piece] if isinstance(value, torch.Tensor) else value


def _tempered(z: torch.Tensor, temperature) -> torch.Tensor:
    """z / temperature, in place: one temperature, or one per row."""
    if isinstance(temperature, torch.Tensor):
        return z.div_(temperature.to(z.dtype)[:, None])
    return z.div_(temperature) if temperature != 1.0 else z


def _chunk_scores(hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Module, temperature,
                  softcap: float | None, top_p: torch.Tensor | None = None,
                  top_k: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain computation for one chunk: what the general path checkpoints."""
    logits = head(hidden).float()
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    logits = logits / (temperature[:, None] if isinstance(temperature, torch.Tensor) else temperature)
    if top_p is not None or top_k is not None:
        with torch.no_grad():  # which tokens are kept is not differentiated (a mask), the kept logits are
            dropped = truncate(logits.detach().clone(), targets, top_p, top_k).isneginf()
        logits = logits.masked_fill(dropped, float("-inf"))
    logp = torch.log_softmax(logits, dim=-1)
    with torch.no_grad():
        entropy = -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1), entropy


class _ProjectedLogprobs(torch.autograd.Function):
    """Log-probs through a frozen linear head, chunk by chunk, with the analytic gradient (module docstring)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, dtype, rows, top_p=None, top_k=None):
        n = hidden.shape[0]
        logprobs = torch.empty(n, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty_like(logprobs)
        # d log p_t / d hidden = (W_t - p @ W) / T = (onehot_t - p) @ W / T, kept from the forward. The coefficient
        # (onehot_t - p) is formed in float32 before the cast: W_t - (p @ W) in bfloat16 cancels nearly every digit
        # when p_t is near 1 (a confident token's gradient came out 80-100% wrong).
        residual = (torch.empty(n, hidden.shape[1], dtype=torch.float32, device=hidden.device)
                    if ctx.needs_input_grad[0] else None)
        w = weight.to(dtype)
        # Autocast would pick its own precision for the products; the casts here are explicit.
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, n, rows):
                end = min(n, start + rows)
                z = _tempered((hidden[start:end].to(dtype) @ w.T).float(), _rows_of(temperature, slice(start, end)))
                if top_p is not None or top_k is not None:  # dropped tokens get p = 0: the residual needs no change
                    truncate(z, targets[start:end], _rows_of(top_p, slice(start, end)),
                             _rows_of(top_k, slice(start, end)))
                z -= torch.logsumexp(z, dim=-1, keepdim=True)  # z is now log p
                logprobs[start:end] = z.gather(1, targets[start:end, None]).squeeze(1)
                p = z.exp()
                entropy[start:end] = -(z.nan_to_num_(neginf=0.0).mul_(p)).sum(-1)
                if residual is not None:
                    p.neg_().scatter_add_(1, targets[start:end, None], torch.ones_like(p[:, :1]))  # onehot - p
                    residual[start:end] = (p.to(dtype) @ w).float()
                del z, p
        if isinstance(temperature, torch.Tensor):
            ctx.save_for_backward(residual, temperature)
        else:
            ctx.save_for_backward(residual)
        ctx.temperature = temperature
        ctx.hidden_dtype = hidden.dtype
        ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, _grad_entropy):
        residual, *per_row = ctx.saved_tensors
        if residual is None:
            return (None,) * 8
        temperature = per_row[0].to(grad_logprobs.dtype) if per_row else ctx.temperature
        grad = residual * (grad_logprobs / temperature).unsqueeze(1)
        return grad.to(ctx.hidden_dtype), None, None, None, None, None, None, None
