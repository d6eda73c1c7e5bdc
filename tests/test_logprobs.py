"""Chunked log-probs (trainer/logprobs.py) against the plain full-vocabulary computation: same values, same gradients,
and no [tokens x vocabulary] tensor kept for backward."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from core.settings import TrainingSettings  # noqa: E402
from trainer.logprobs import collate, score, token_scores  # noqa: E402
from trainer.ppo import PolicyTrainer  # noqa: E402
from trainer.transitions import Transition  # noqa: E402


def _transitions(vocab: int) -> list[Transition]:
    g = torch.Generator().manual_seed(3)
    rows = []
    for prompt, completion in ((9, 5), (6, 8), (12, 3)):  # ragged: padding and prompts of other lengths
        ids = torch.randint(0, vocab, (prompt + completion,), generator=g).tolist()
        rows.append(Transition(prompt_ids=ids[:prompt], completion_ids=ids[prompt:],
                               behaviour_logprobs=[0.0] * completion, advantage=1.0,
                               loss_mask=[1] * (completion - 1) + [0]))
    return rows


def _plain(model: torch.nn.Module, mb, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """What the trainer computed before: the LM head over every position, log-softmax of the whole thing."""
    position_ids = (mb.attention_mask.cumsum(-1) - 1).masked_fill(mb.attention_mask == 0, 1)
    logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, position_ids=position_ids,
                   use_cache=False).logits[:, mb.start:-1].float() / temperature
    logp = torch.log_softmax(logits, dim=-1)
    chosen = logp.gather(-1, mb.input_ids[:, mb.start + 1:].unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return chosen * mb.scored, entropy.detach() * mb.scored


def _lora_gradients(trainer: PolicyTrainer, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    trainer.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


@pytest.fixture(scope="module")
def bundled_trainer() -> PolicyTrainer:
    from engine.model import prepare_model

    # float32 throughout: on a CPU with fast bfloat16 the trainer would keep the weights in bfloat16, whose
    # rounding (not the chunking) would then be what the comparisons below measure
    trainer = PolicyTrainer(prepare_model(), TrainingSettings(bf16=False))
    with torch.no_grad():  # a trained adapter: B = 0 would leave every gradient of A at zero
        g = torch.Generator().manual_seed(0)
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=g) * 0.02)
    return trainer


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_bundled_model_chunked_logprobs_and_gradients_equal_the_full_vocabulary_ones(bundled_trainer, temperature):
    trainer = bundled_trainer
    mb = collate(_transitions(trainer.model.config.vocab_size))
    weights = torch.linspace(-1.0, 1.0, mb.scored.numel()).view_as(mb.scored) * mb.loss_mask  # any loss will do

    plain, plain_entropy = _plain(trainer.model, mb, temperature)
    plain_grads = _lora_gradients(trainer, (plain * weights).sum())
    chunked, entropy = score(trainer.model, mb, temperature=temperature)
    chunked_grads = _lora_gradients(trainer, (chunked * weights).sum())

    assert bool(mb.scored.any()) and float(plain.detach().abs().sum()) > 0
    # equal up to float32 rounding: log-probs near -20 carry about 2e-6 of it, an entropy summed over 49k terms 1e-5
    torch.testing.assert_close(chunked, plain, rtol=2e-6, atol=1e-5)
    torch.testing.assert_close(entropy, plain_entropy, rtol=5e-5, atol=1e-5)
    assert chunked_grads.keys() == plain_grads.keys() and len(plain_grads) > 0
    for name, grad in plain_grads.items():  # every LoRA matrix of all 30 layers: rounding differences, no more
        assert float(grad.abs().max()) > 0, name
        assert float((chunked_grads[name] - grad).norm() / grad.norm()) < 1e-4, name


def test_bundled_model_chunk_size_changes_nothing_but_memory(bundled_trainer):
    """Chunks of 1 row and one chunk of every row give the same log-probs: chunking is only a memory bound."""
    mb = collate(_transitions(bundled_trainer.model.config.vocab_size))
    with torch.no_grad():
        base = bundled_trainer.model.get_base_model()
        hidden = base.get_decoder()(input_ids=mb.input_ids, attention_mask=mb.attention_mask,
                                    use_cache=False).last_hidden_state[:, mb.start:-1][mb.scored]
        targets = mb.input_ids[:, mb.start + 1:][mb.scored]
        head = base.get_output_embeddings()
        one = token_scores(hidden, head, targets, rows=1)
        whole = token_scores(hidden, head, targets, rows=hidden.shape[0])
    torch.testing.assert_close(one.logprobs, whole.logprobs, rtol=2e-6, atol=1e-5)
    torch.testing.assert_close(one.entropy, whole.entropy, rtol=5e-5, atol=1e-5)


def test_nothing_of_vocabulary_size_is_kept_for_backward():
    vocab, width, rows = 5000, 16, 64
    head = torch.nn.Linear(width, vocab, bias=False).requires_grad_(False)
    hidden = torch.randn(rows, width, requires_grad=True)
    targets = torch.randint(0, vocab, (rows,))
    kept: list[tuple[int, ...]] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(tuple(t.shape)) or t, lambda t: t):
        scores = token_scores(hidden, head, targets, rows=8)
    # [rows, width] only: the plain way keeps [rows, vocab] tensors
    assert sorted(kept) == [(rows, width)]
    scores.logprobs.sum().backward()
    assert hidden.grad is not None and float(hidden.grad.abs().sum()) > 0


def test_a_trained_head_is_checkpointed_per_chunk_with_the_same_gradients():
    """A head whose weight is trained (or a LoRA-wrapped one) takes the recomputing path: gradients reach it too."""
    torch.manual_seed(0)
    vocab, width, rows = 300, 12, 10
    head = torch.nn.Linear(width, vocab, bias=False)
    hidden = torch.randn(rows, width, requires_grad=True)
    targets = torch.randint(0, vocab, (rows,))

    chunked = token_scores(hidden, head, targets, rows=3, temperature=0.8)
    chunked.logprobs.sum().backward()
    chunked_grads = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None
    logp = torch.log_softmax(head(hidden) / 0.8, dim=-1)
    plain = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    plain.sum().backward()

    torch.testing.assert_close(chunked.logprobs, plain.detach(), rtol=0, atol=1e-6)
    torch.testing.assert_close(chunked.entropy, -(logp.exp() * logp).sum(-1).detach(), rtol=0, atol=1e-5)
    torch.testing.assert_close(chunked_grads[0], hidden.grad, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(chunked_grads[1], head.weight.grad, rtol=1e-5, atol=1e-7)


def test_confident_tokens_keep_their_gradient_when_the_projection_is_in_bfloat16():
    """p_t between 0.99 and 0.9999: forming W_t - p @ W after a bfloat16 product cancelled nearly every digit
    (median error 80%, some gradients pointing elsewhere). The coefficient onehot - p is formed in float32 first."""
    torch.manual_seed(0)
    vocab, width, rows = 4096, 64, 256
    weight = torch.randn(vocab, width) * 0.05
    targets = torch.randint(0, vocab, (rows,))
    hidden = torch.randn(rows, width) * 0.05 + weight[targets] * torch.linspace(20, 400, rows)[:, None]
    head = torch.nn.Linear(width, vocab, bias=False).requires_grad_(False)
    head.weight.data.copy_(weight)

    def gradient(dtype):
        h = hidden.clone().requires_grad_(True)
        token_scores(h, head, targets, compute_dtype=dtype).logprobs.sum().backward()
        return h.grad

    p_target = torch.log_softmax(hidden @ weight.T, -1).gather(1, targets[:, None]).squeeze(1).exp()
    confident = (p_target >= 0.99) & (p_target < 0.9999)
    assert int(confident.sum()) >= 20
    exact, fast = gradient(torch.float32), gradient(torch.bfloat16)
    error = ((fast - exact).norm(dim=1) / exact.norm(dim=1))[confident]
    assert float(error.median()) < 0.1, error


def _as_sampled(logits: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
                top_k: torch.Tensor) -> torch.Tensor:
    """Row by row, as vLLM samples: logits / T, top-k, then top-p over what is left, renormalised."""
    out = []
    for z, target, t, p, k in zip(logits, targets, temperature, top_p, top_k):
        z = z / t
        if k > 0:
            z = z.masked_fill(z < z.topk(min(int(k), z.numel())).values[-1], float("-inf"))
        probs = z.softmax(-1)
        ordered, order = probs.sort(descending=True)
        dropped = order[(ordered.cumsum(0) - ordered) >= p]
        z = z.clone()
        z[dropped[dropped != order[0]]] = float("-inf")
        out.append(z.log_softmax(-1)[target])
    return torch.stack(out)


@pytest.mark.parametrize("trained_head", [False, True])
def test_each_row_is_scored_at_its_own_temperature_and_truncation_with_the_same_gradients(trained_head):
    """One batch of tokens at 0.7 / top_p 0.95 / top_k 20, 1.3, 1.0 untruncated, a top_k past the vocabulary (all
    kept) and top_p 0 (the most probable token alone), through both paths (frozen head: analytic backward;
    trained head: checkpointed chunks), against the plain computation."""
    torch.manual_seed(0)
    hidden = torch.randn(5, 16, requires_grad=True)
    head = torch.nn.Linear(16, 50, bias=False).requires_grad_(trained_head)
    with torch.no_grad():
        targets = (hidden @ head.weight.T).argsort(-1, descending=True)[:, 3]  # the fourth most probable
        targets[4] = (hidden[4] @ head.weight.T).argmax()  # top_p 0 keeps only it
    temperature = torch.tensor([0.7, 1.3, 1.0, 0.9, 1.0])
    top_p = torch.tensor([0.95, 1.0, 1.0, 1.0, 0.0])
    top_k = torch.tensor([20, 0, 0, 10_000, 0])
    scores = token_scores(hidden, head, targets, temperature=temperature, top_p=top_p, top_k=top_k, rows=2)
    expected = _as_sampled(hidden @ head.weight.T, targets, temperature, top_p, top_k)
    torch.testing.assert_close(scores.logprobs, expected, atol=1e-5, rtol=1e-5)
    assert float(scores.logprobs[4]) == pytest.approx(0.0, abs=1e-6)  # the only token kept
    mine, = torch.autograd.grad(scores.logprobs.sum(), hidden)
    plain, = torch.autograd.grad(expected.sum(), hidden)
    torch.testing.assert_close(mine, plain, atol=1e-5, rtol=1e-5)


def _multi_turn(vocab: int) -> list[Transition]:
    """Merged agent turns: sampled spans (mask 1) with tool results between them (mask 0), as trainer/batch.py
    builds them; ragged, so padding is exercised too."""
    g = torch.Generator().manual_seed(5)
    rows = []
    for prompt, spans in ((8, ((4, 1), (6, 0), (3, 1), (9, 0), (2, 1))), (5, ((3, 1), (12, 0), (5, 1)))):
        mask = [keep for length, keep in spans for _ in range(length)]
        ids = torch.randint(0, vocab, (prompt + len(mask),), generator=g).tolist()
        rows.append(Transition(prompt_ids=ids[:prompt], completion_ids=ids[prompt:],
                               behaviour_logprobs=[-2.0 if keep else 0.0 for keep in mask],
                               advantage=1.0, loss_mask=mask))
    return rows


def test_a_step_projects_only_its_trained_positions_and_learns_what_the_full_projection_learns(tiny_model):
    """A step's micro-batches send only loss-mask-1 positions through the LM head (the tool results between the
    sampled spans stop at the last hidden state): the log-probs there, their gradients and one PPO step's LoRA
    weights equal those of the projection of every completion position."""
    from trainer import ppo

    settings = TrainingSettings(bf16=False, kl_coef=0.0, mini_batches=1, learning_rate=1e-2)
    batch = _multi_turn(512)
    full = collate(batch)
    trained = collate(batch, trained_only=True)
    assert int(trained.projected.sum()) == sum(t.num_trained_tokens() for t in batch) == 17
    assert int(full.scored.sum()) == 44  # 27 positions of tool results are not projected

    policy = PolicyTrainer(tiny_model, settings)
    with torch.no_grad():  # a trained adapter: with B = 0 no gradient reaches A
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(1)) * 0.05)
    start = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    every, _ = score(policy.model, full)
    only, _ = score(policy.model, trained)
    torch.testing.assert_close(only, every * trained.loss_mask, rtol=1e-6, atol=1e-6)
    assert float((only.detach() * (1 - trained.loss_mask)).abs().sum()) == 0.0
    weights = torch.linspace(0.5, 1.5, full.scored.numel()).view_as(full.scored) * full.loss_mask
    grads = {}
    for name, mb in (("every", full), ("only", trained)):
        policy.optimizer.zero_grad(set_to_none=True)
        (score(policy.model, mb)[0] * weights).sum().backward()
        grads[name] = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    for name, grad in grads["every"].items():
        assert float(grad.abs().max()) > 0, name
        torch.testing.assert_close(grads["only"][name], grad, rtol=1e-5, atol=1e-7)

    def stepped(projection) -> dict[str, torch.Tensor]:
        policy.optimizer.state.clear()
        policy.optimizer.zero_grad(set_to_none=True)  # the gradients above are not this step's
        policy.step_count = 0  # the same shuffle of the batch
        with torch.no_grad():
            for name, param in policy.model.named_parameters():
                if name in start:
                    param.copy_(start[name])
        original = ppo.collate
        ppo.collate = projection
        try:
            metrics = policy.step(batch)
        finally:
            ppo.collate = original
        assert metrics.trained_tokens == 17 and metrics.grad_norm > 0
        return {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}

    as_trained = stepped(collate)
    as_full = stepped(lambda group, served_version=None, trained_only=False: collate(group,
                                                                                      served_version=served_version))
    for name, value in as_full.items():
        assert not torch.equal(value, start[name]), name  # the step moved every LoRA matrix
        torch.testing.assert_close(as_trained[name], value, rtol=1e-6, atol=1e-8)


def test_lm_head_rows_per_chunk_follow_the_device():
    """A CPU keeps 32 MB of logits per chunk; a GPU takes an eighth of its free memory for a chunk's tensors, from
    the CPU's rows up to 4,096 (Qwen3's 151,936-token vocabulary: 55 rows on a CPU)."""
    from trainer.logprobs import chunk_rows, device_chunk_rows

    qwen3 = 151_936
    assert chunk_rows(qwen3) == 55 == device_chunk_rows(qwen3, torch.device("cpu"))
    assert chunk_rows(qwen3, free_bytes=30 * 10**9) == 30 * 10**9 // (8 * 12 * qwen3) == 2056
    assert chunk_rows(qwen3, free_bytes=10**8) == 55  # a nearly full device: never below the CPU's chunk
    assert chunk_rows(32_000, free_bytes=10**12) == 4096
