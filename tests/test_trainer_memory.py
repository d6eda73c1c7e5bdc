"""What bounds the trainer's memory (trainer/memory.py): the token budget, checkpointing past it, and the allocator."""
from __future__ import annotations

import platform

import pytest

torch = pytest.importorskip("torch")

from core.settings import TrainingSettings  # noqa: E402
from trainer.memory import release_free_memory, tune_allocator  # noqa: E402
from trainer.ppo import PolicyTrainer  # noqa: E402
from trainer.transitions import Transition  # noqa: E402


def _batch() -> list[Transition]:
    g = torch.Generator().manual_seed(1)
    out = []
    for i, (prompt, completion) in enumerate(((90, 30), (20, 10), (18, 10))):  # the first: 120 tokens
        ids = torch.randint(0, 512, (prompt + completion,), generator=g).tolist()
        out.append(Transition(prompt_ids=ids[:prompt], completion_ids=ids[prompt:],
                              behaviour_logprobs=[-6.0] * completion, advantage=1.0 if i % 2 else -1.0))
    return out


def _saved_for_backward(trainer: PolicyTrainer, batch: list[Transition]) -> tuple[int, object]:
    """Bytes the step's forward passes handed to autograd to keep (outside any checkpointed layer), and the metrics."""
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t.numel() * t.element_size()) or t,
                                                  lambda t: t):
        metrics = trainer.step(batch)
    return sum(kept), metrics


def test_a_transition_over_the_token_budget_is_checkpointed_and_trains_exactly_the_same(tiny_model):
    # one update per step (mini_batches=1): the step below is one forward/backward of the whole batch
    # float32 (bf16=False): on a CPU with fast bfloat16 its rounding would differ between the two groupings
    roomy = PolicyTrainer(tiny_model, TrainingSettings(micro_batch_tokens=4096, learning_rate=1e-2, mini_batches=1,
                                                  bf16=False))
    tight = PolicyTrainer(tiny_model, TrainingSettings(micro_batch_tokens=64, learning_rate=1e-2, mini_batches=1,
                                                  bf16=False))
    batch = _batch()

    roomy_bytes, roomy_metrics = _saved_for_backward(roomy, batch)
    tight_bytes, tight_metrics = _saved_for_backward(tight, batch)

    # 64 tokens: the 120-token transition alone, checkpointed; the two short ones together (2 x 30 = 60)
    assert tight_metrics.micro_batches == 2 and roomy_metrics.micro_batches == 1
    assert tight_bytes < roomy_bytes / 2
    assert tight_metrics.loss == pytest.approx(roomy_metrics.loss, rel=1e-5, abs=1e-7)
    assert tight_metrics.grad_norm == pytest.approx(roomy_metrics.grad_norm, rel=1e-4)
    # AdamW's first update is lr x g / (|g| + eps): the rounding of the padded micro-batches (the proximal log-probs
    # and importance weights come from them too) moves a weight by a few 1e-6, 0.03% of a step; a weight whose
    # gradient is within rounding of zero can move more (measured: one of 7,168 by 5.3e-5, 0.5% of a step)
    for (name, a), (_, b) in zip(roomy.model.named_parameters(), tight.model.named_parameters()):
        if a.requires_grad:
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4, msg=name)
            assert int(((b - a).abs() > 1e-5).sum()) <= 2, name
    assert not any(getattr(m, "gradient_checkpointing", False) for m in tight.model.modules())  # off again


def test_the_token_budget_follows_the_device_unless_set():
    assert TrainingSettings().micro_batch_tokens == 0  # by device: the policy trainer's micro_batch_tokens after start
    with pytest.raises(ValueError, match="micro_batch_tokens"):
        TrainingSettings(micro_batch_tokens=-1)


def test_cpu_trainer_takes_the_cpu_budget(tiny_model):
    if torch.cuda.is_available():
        pytest.skip("a GPU machine takes the GPU budget")
    assert PolicyTrainer(tiny_model, TrainingSettings()).config.micro_batch_tokens == 384


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_freed_heap_memory_goes_back_to_the_system():
    assert tune_allocator()
    # 512 KB blocks stay under the 1 MB threshold, so they come from the heap; keeping every other one alive
    # leaves the freed half as holes glibc would otherwise hold on to
    blocks = [bytearray(512 * 1024) for _ in range(400)]
    del blocks[::2]
    held = _rss()
    release_free_memory()
    assert held - _rss() > 50 * 1024 * 1024  # of the ~100 MB freed
    assert len(blocks) == 200
