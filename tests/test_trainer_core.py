"""The training core on a tiny random Llama (no downloads): transitions, packing, PPO, adapter I/O."""
from __future__ import annotations

import json
import math
import os
import sys

import pytest

from core.settings import TrainingSettings
from trainer.transitions import Call, SkipReasons, Transition, merge_trajectory, pack_micro_batches

torch = pytest.importorskip("torch")

from tests.trainer_support import make_trainer, on_policy_batch


def mean_logprob(trainer, transitions) -> list[float]:
    return [sum(lp) / len(lp) for lp in trainer.logprobs(transitions)]


# --- compat --------------------------------------------------------------------------------------------


@pytest.mark.train
def test_openrlhf_imports_and_stubs_do_not_leak():
    from trainer.compat import MissingDependencyError, _build_stub, import_openrlhf

    parts = import_openrlhf()
    assert parts.Actor.__name__ == "Actor" and parts.PolicyLoss.__name__ == "PolicyLoss"
    assert float(parts.masked_mean(torch.tensor([1.0, 3.0]), torch.tensor([1.0, 0.0]))) == 1.0
    # Stubs exist only during the import: nothing else in the process may take them for the real package.
    for name in list(sys.modules):
        assert not vars(sys.modules[name]).get("__rlproxy_stub__", False), name
    stub = _build_stub("flash_attn")
    assert stub["flash_attn"].bert_padding is stub["flash_attn.bert_padding"]
    with pytest.raises(MissingDependencyError, match="flash_attn"):
        stub["flash_attn.bert_padding"].pad_input(None)


# --- transitions ---------------------------------------------------------------------------------------


def test_merge_trajectory_masks_context_and_keeps_unlinked_calls_apart():
    calls = [
        Call([1, 2, 3], [4, 5], [-0.1, -0.2], advantage=1.0, call_id="a", rollout_id="r", policy_version=3),
        # Extends a: tokens 6, 7 (e.g. a tool result) were not sampled by the model.
        Call([1, 2, 3, 4, 5, 6, 7], [8], [-0.3], advantage=1.0, extends_previous=True, call_id="b",
             rollout_id="r", policy_version=2),
        Call([9, 10], [11], [-0.4], advantage=1.0, call_id="c"),
        # Flagged, but the prefix differs (re-tokenised history): must not be merged.
        Call([9, 99, 11, 12], [13], [-0.5], advantage=1.0, extends_previous=True, call_id="d"),
    ]
    merged, c, d = merge_trajectory(calls, max_seq_len=64)
    assert merged.prompt_ids == [1, 2, 3]
    assert merged.completion_ids == [4, 5, 6, 7, 8]
    assert merged.loss_mask == [1, 1, 0, 0, 1]
    assert merged.behaviour_logprobs == [-0.1, -0.2, 0.0, 0.0, -0.3]
    assert merged.advantage == 1.0 and merged.token_advantages is None
    assert merged.call_ids == ["a", "b"] and merged.rollout_id == "r" and merged.policy_version == 2
    assert (c.call_id, c.loss_mask, c.completion_ids) == ("c", None, [11])
    assert (d.call_id, d.prompt_ids) == ("d", [9, 99, 11, 12])


def test_merge_trajectory_per_call_advantages_become_per_token():
    calls = [Call([1], [2], [-1.0], advantage=0.5),
             Call([1, 2, 3], [4], [-1.0], advantage=1.0, extends_previous=True)]
    (t,) = merge_trajectory(calls, max_seq_len=64)
    assert t.advantages() == [0.5, 0.0, 1.0]


def test_merge_trajectory_counts_skips_and_invalid_calls_break_the_chain():
    skips = SkipReasons()
    calls = [
        {"prompt_ids": [], "completion_ids": [1], "logprobs": [-1.0]},
        {"prompt_ids": [1], "completion_ids": [], "logprobs": []},
        {"prompt_ids": [1], "completion_ids": [2, 3], "logprobs": [-1.0]},
        {"prompt_ids": [1], "completion_ids": [2], "logprobs": [float("nan")]},
        # a NaN logit reaches a stream as "logprob": null; a broken engine could send a null token id
        {"prompt_ids": [1], "completion_ids": [2, 3], "logprobs": [-1.0, None]},
        {"prompt_ids": [1], "completion_ids": [None], "logprobs": [-1.0]},
        {"prompt_ids": [1] * 8, "completion_ids": [2] * 3, "logprobs": [-1.0] * 3},
        {"prompt_ids": [1, 2], "completion_ids": [3], "logprobs": [-1.0]},
        {"prompt_ids": [1, 2, 3, 4], "completion_ids": [5], "logprobs": [-1.0], "extends_previous": True},
        {"prompt_ids": [1, 2, 3, 4, 5, 6], "completion_ids": [7] * 5, "logprobs": [-1.0] * 5},  # too long
        # Extends a call that was skipped: starts afresh from its own full prompt.
        {"prompt_ids": [1, 2, 3, 4, 5, 6, 7, 7], "completion_ids": [8], "logprobs": [-1.0],
         "extends_previous": True},
    ]
    out = merge_trajectory(calls, max_seq_len=10, skips=skips)
    assert skips == {
        SkipReasons.NO_TOKEN_IDS: 2, SkipReasons.EMPTY_COMPLETION: 1, SkipReasons.LOGPROB_COUNT: 1,
        SkipReasons.NONFINITE_LOGPROB: 2, SkipReasons.TOO_LONG: 2,
    }
    assert [(t.prompt_ids, t.loss_mask) for t in out] == [
        ([1, 2], [1, 0, 1]), ([1, 2, 3, 4, 5, 6, 7, 7], None)
    ]


def test_pack_micro_batches_respects_budget():
    import random

    rng = random.Random(0)
    items = [Transition([0] * rng.randint(1, 60), [1] * rng.randint(1, 40), [0.0], 0.0) for _ in range(50)]
    items.append(Transition([0] * 150, [1] * 10, [0.0] * 10, 0.0))  # longer than the budget
    batches = pack_micro_batches(items, token_budget=128)
    assert sorted(map(id, (t for b in batches for t in b))) == sorted(map(id, items))
    for b in batches:
        assert len(b) * max(len(t) for t in b) <= 128 or len(b) == 1
    assert [len(t) for t in next(b for b in batches if len(b[0]) == 160)] == [160]


def test_ranks_get_transitions_of_near_equal_tokens_not_equal_counts():
    """An agent's few long merged conversations and many short calls: dealt by count (every other one), one of two
    ranks drew 6 times the other's tokens; by tokens they are within the longest transition of each other."""
    from trainer.transitions import split_by_tokens

    lengths = [900, 40, 850, 40, 800, 40, 700, 40] + [30, 40] * 10  # as the rollouts came
    items = [Transition([0] * (n - 10), [1] * 10, [0.0] * 10, 0.0) for n in lengths]
    by_count = [sum(map(len, items[r::2])) for r in range(2)]
    assert by_count == [3550, 560]
    for ranks in (2, 3, 4):
        shares = split_by_tokens(items, ranks)
        assert sorted(map(id, (t for share in shares for t in share))) == sorted(map(id, items))
        tokens = [sum(map(len, share)) for share in shares]
        assert max(tokens) - min(tokens) <= max(lengths), (ranks, tokens)
    assert [sum(map(len, share)) for share in split_by_tokens(items, 2)] == [2070, 2040]
    assert split_by_tokens(items[:1], 3)[1:] == [[], []]  # fewer transitions than ranks: the others run placeholders


def test_config_validates():
    assert TrainingSettings().target_modules and TrainingSettings.__pydantic_fields__["kl_coef"].description
    for bad in ({"lora_rank": 0}, {"credit": "x"}, {"advantage_estimator": "ppo"}, {"kl_estimator": "k4"},
                {"clip_eps_low": 1.0}, {"gamma": 0.0}, {"target_modules": []}):
        with pytest.raises(ValueError):
            TrainingSettings(**bad)


# --- PPO -----------------------------------------------------------------------------------------------


@pytest.mark.train
def test_on_policy_step_has_unit_ratio_and_no_clipping(tiny_model):
    trainer = make_trainer(tiny_model)
    batch = on_policy_batch(trainer)
    # A merged two-turn sequence: its context tokens carry placeholder log-probs that must be masked out.
    (merged,) = merge_trajectory(
        [Call([5, 6, 7], [8, 9], [0.0, 0.0], advantage=1.0),
         Call([5, 6, 7, 8, 9, 10, 11], [12, 13], [0.0, 0.0], advantage=1.0, extends_previous=True)],
        max_seq_len=64,
    )
    scores = trainer.logprobs([merged])[0]
    merged.behaviour_logprobs = [lp if keep else 0.0 for lp, keep in zip(scores, merged.loss_mask)]
    batch.append(merged)
    m = trainer.step(batch)
    assert m.micro_batches >= 2  # gradient accumulation is exercised
    assert m.ratio_mean == pytest.approx(1.0, abs=1e-4) and m.ratio_max == pytest.approx(1.0, abs=1e-3)
    assert m.clip_fraction == 0.0
    assert m.kl == pytest.approx(0.0, abs=1e-6)  # LoRA B starts at zero: policy == base
    assert m.trained_tokens == 24 + 4 and m.tokens == sum(len(t) for t in batch)
    assert math.isfinite(m.loss) and m.grad_norm > 0 and m.entropy > 0 and m.tokens_per_s > 0


@pytest.mark.train
def test_advantage_sign_drives_logprobs_and_kl_grows(tiny_model):
    trainer = make_trainer(tiny_model)
    batch = on_policy_batch(trainer)
    before = mean_logprob(trainer, batch)
    metrics = [trainer.step(batch) for _ in range(8)]
    after = mean_logprob(trainer, batch)
    for t, b, a in zip(batch, before, after):
        if t.advantage > 0:
            assert a > b + 0.02, (b, a)
        else:
            assert a < b - 0.02, (b, a)
    assert metrics[-1].kl > 1e-4
    # The policy moved away from the one that sampled: the importance weight says so, while the PPO ratio of a
    # one-update step is taken against the step's own proximal policy and stays 1 (decoupled PPO).
    assert metrics[-1].is_weight_mean != pytest.approx(1.0, abs=1e-4) and abs(metrics[-1].off_policy_kl) > 1e-4
    assert metrics[-1].ratio_mean == pytest.approx(1.0, abs=1e-6)


@pytest.mark.train
def test_step_is_deterministic_and_counts_skips(tiny_model):
    results = []
    for _ in range(2):
        trainer = make_trainer(tiny_model)
        batch = on_policy_batch(trainer)
        bad = Transition([1, 2], [3, 4], [-1.0], 1.0)  # logprob count != completion length
        m = trainer.step(batch + [bad])
        results.append((m.loss, mean_logprob(trainer, batch)))
    assert m.skipped == {SkipReasons.LOGPROB_COUNT: 1} and m.transitions == 4
    assert results[0] == results[1]


def test_split_mini_batches_partitions_the_batch_reproducibly():
    from trainer.ppo import split_mini_batches

    batch = [Transition([1, 2], [i], [0.0], 1.0) for i in range(10)]
    shares = split_mini_batches(batch, 4, seed=3)
    assert [len(s) for s in shares] == [3, 3, 2, 2]
    assert sorted(t.completion_ids[0] for s in shares for t in s) == list(range(10))  # each exactly once
    assert split_mini_batches(batch, 4, seed=3) == shares and split_mini_batches(batch, 4, seed=4) != shares
    assert len(split_mini_batches(batch[:2], 4, seed=0)) == 2  # never an empty share


@pytest.mark.train
def test_mini_batches_take_one_update_each_and_learn_more_from_one_batch(tiny_model):
    moved = {}
    for mini_batches in (1, 4):
        trainer = make_trainer(tiny_model, mini_batches=mini_batches, ppo_epochs=2, kl_coef=0.0)
        batch = on_policy_batch(trainer, n=8)
        before = mean_logprob(trainer, batch)
        m = trainer.step(batch)
        assert m.updates == 2 * mini_batches
        after = mean_logprob(trainer, batch)
        # how far the step pushed log-probs in the direction of each transition's advantage
        moved[mini_batches] = sum((a - b) * t.advantage for t, b, a in zip(batch, before, after))
    assert moved[1] > 0 and moved[4] > moved[1]


def test_a_step_over_part_of_a_batch_moves_the_adapter_in_proportion(tiny_model):
    """AdamW's first update is about lr x sign(gradient) whatever the batch holds: a step over one transition where a
    batch is sixteen would be a full-size step of noise. With lr_scale 1/16 the adapter moves a sixteenth as far."""
    moved = {}
    for scale in (1.0, 1 / 16):
        trainer = make_trainer(tiny_model, kl_coef=0.0)
        start = [p.detach().clone() for p in trainer.params]
        trainer.step(on_policy_batch(trainer, n=1), lr_scale=scale)
        moved[scale] = sum(float((p.detach() - s).norm() ** 2) for p, s in zip(trainer.params, start)) ** 0.5
    assert moved[1.0] > 0 and moved[1 / 16] / moved[1.0] == pytest.approx(1 / 16, rel=0.05)
    settings = TrainingSettings(batch_rollouts=16)
    assert (settings.lr_scale_for(1), settings.lr_scale_for(8), settings.lr_scale_for(16),
            settings.lr_scale_for(40)) == (1 / 16, 0.5, 1.0, 1.0)
    assert TrainingSettings(batch_rollouts=16, scale_lr_to_batch=False).lr_scale_for(1) == 1.0


# --- adapter -------------------------------------------------------------------------------------------


@pytest.mark.train
def test_saved_adapter_is_vllm_shaped_and_resumes_exactly(tiny_model, tmp_path):
    from safetensors.torch import load_file

    trainer = make_trainer(tiny_model)
    batch = on_policy_batch(trainer)
    for _ in range(3):
        trainer.step(batch)
    target = trainer.save_adapter(tmp_path / "v3")
    assert sorted(os.listdir(tmp_path)) == ["v3"]  # no temporary directories left behind
    config = json.loads((target / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["lora_alpha"] == 16 and config["peft_type"] == "LORA"
    assert config["target_modules"] == sorted(TrainingSettings().target_modules)
    assert config["modules_to_save"] is None and config["base_model_name_or_path"] == str(tiny_model)
    keys = load_file(str(target / "adapter_model.safetensors")).keys()
    assert keys and all(
        k.startswith("base_model.model.") and (".lora_A." in k or ".lora_B." in k) for k in keys
    )

    resumed = make_trainer(tiny_model, adapter_dir=target)
    assert resumed.step_count == 3
    flat = lambda rows: [x for row in rows for x in row]  # noqa: E731
    assert flat(resumed.logprobs(batch)) == pytest.approx(flat(trainer.logprobs(batch)), abs=1e-6)
    assert resumed.optimizer.state_dict()["state"]  # AdamW moments restored, not reset
    assert trainer.step(batch).loss == pytest.approx(resumed.step(batch).loss, abs=1e-6)


def test_a_bf16_served_copy_is_what_engines_read_and_hash_and_training_resumes_from_float32(tiny_model, tmp_path):
    """Where the engines serve bf16 (GPUs), the replicas read and the publish hashes a bf16 adapter_model.safetensors
    (half the bytes); the float32 master weights are resume-only, beside optimizer.pt, and a resume takes them."""
    from safetensors.torch import load_file

    from engine.fleet import folder_digest
    from trainer.adapter import MASTER_WEIGHTS, load_adapter, save_adapter_atomically
    from trainer.sharding import lora_weights

    trainer = make_trainer(tiny_model)
    trainer.step(on_policy_batch(trainer))
    weights = lora_weights(trainer.model)
    target = save_adapter_atomically(trainer.model, trainer.optimizer.state_dict(), tmp_path / "v1",
                                     weights=weights, serving_dtype=torch.bfloat16)
    served, master = load_file(str(target / "adapter_model.safetensors")), load_file(str(target / MASTER_WEIGHTS))
    assert {t.dtype for t in served.values()} == {torch.bfloat16} and {t.dtype for t in master.values()} == {
        torch.float32}
    assert all(torch.equal(served[k], weights[k].to(torch.bfloat16)) for k in weights)
    before = folder_digest(target)
    (target / MASTER_WEIGHTS).write_bytes(b"not what an engine reads")
    (target / "optimizer.pt").unlink()
    assert folder_digest(target) == before  # only the served files are hashed (and read) by the replicas
    (target / MASTER_WEIGHTS).unlink()
    save_adapter_atomically(trainer.model, None, target, weights=weights, serving_dtype=torch.bfloat16)
    other = make_trainer(tiny_model)
    load_adapter(other.model, target)
    assert all(torch.equal(p, weights[k]) for k, p in lora_weights(other.model).items())  # float32, not rounded
    (target / MASTER_WEIGHTS).unlink()  # what retention drops from a version training no longer goes on from
    load_adapter(other.model, target)
    assert all(torch.equal(p, weights[k].to(torch.bfloat16).float()) for k, p in lora_weights(other.model).items())
    plain = save_adapter_atomically(trainer.model, None, tmp_path / "cpu", weights=weights)  # a CPU's engines
    assert not (plain / MASTER_WEIGHTS).exists()
    assert {t.dtype for t in load_file(str(plain / "adapter_model.safetensors")).values()} == {torch.float32}


def test_a_resumed_trainer_takes_the_weight_decay_it_is_given_not_the_saved_one(tiny_model, tmp_path):
    """The optimizer's state, saved beside an adapter, carries the settings it was made with: an operator who
    changes weight_decay before a restart must get the new one."""
    trainer = make_trainer(tiny_model)
    batch = on_policy_batch(trainer)
    trainer.step(batch)
    target = trainer.save_adapter(tmp_path / "v1")
    resumed = make_trainer(tiny_model, adapter_dir=target, weight_decay=0.1)
    resumed.step(batch)
    assert {group["weight_decay"] for group in resumed.optimizer.param_groups} == {0.1}


@pytest.mark.train
def test_failed_save_leaves_nothing_or_the_old_adapter(tiny_model, tmp_path, monkeypatch):
    import trainer.adapter as adapter

    trainer = make_trainer(tiny_model)
    old = trainer.save_adapter(tmp_path / "current")
    old_bytes = (old / "adapter_model.safetensors").read_bytes()
    trainer.step(on_policy_batch(trainer))

    def crash(tensors, path):  # dies half-way through the weight file
        path.write_bytes(b"\x00" * 16)
        raise OSError("disk full")

    monkeypatch.setattr(adapter, "_write_weights", crash)
    with pytest.raises(OSError, match="disk full"):
        trainer.save_adapter(tmp_path / "fresh")
    with pytest.raises(OSError, match="disk full"):
        trainer.save_adapter(tmp_path / "current")
    assert sorted(os.listdir(tmp_path)) == ["current"]
    assert (old / "adapter_model.safetensors").read_bytes() == old_bytes

    monkeypatch.undo()  # a successful save replaces the old adapter in one swap
    trainer.save_adapter(tmp_path / "current")
    assert sorted(os.listdir(tmp_path)) == ["current"]
    assert (old / "adapter_model.safetensors").read_bytes() != old_bytes


def test_load_none_returns_to_the_base_model_and_load_dir_restores_a_version(tiny_model, tmp_path):
    trainer = make_trainer(tiny_model)
    batch = on_policy_batch(trainer)
    base = mean_logprob(trainer, batch)
    for _ in range(3):
        trainer.step(batch)
    trained = mean_logprob(trainer, batch)
    assert trained != pytest.approx(base, abs=1e-4)
    trainer.save_adapter(tmp_path / "v1")

    trainer.load(None)
    assert mean_logprob(trainer, batch) == pytest.approx(base, abs=1e-5)
    trainer.load(tmp_path / "v1")
    assert mean_logprob(trainer, batch) == pytest.approx(trained, abs=1e-5)


def test_a_policy_from_the_base_model_starts_from_a_fresh_adapter_not_another_policys(tiny_model):
    """Named policies are trained in turn on one model copy (trainer/worker.py). One that starts from the base
    model starts from the adapter the trainer drew from its seed, not from the LoRA A another policy's steps
    left in the copy: its first step gives exactly what the copy's very first step gave."""
    trainer = make_trainer(tiny_model)
    batch = on_policy_batch(trainer)
    drawn = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_A" in n}
    trainer.step(batch)  # policy "a", from the base model
    first_step = mean_logprob(trainer, batch)
    trainer.step(batch)  # once B is no longer zero, a's steps move A too
    assert any(not torch.equal(p, drawn[n]) for n, p in trainer.model.named_parameters() if "lora_A" in n)

    trainer.load(None)  # policy "b", new: from the base model, on the same copy
    assert all(torch.equal(p, drawn[n]) for n, p in trainer.model.named_parameters() if "lora_A" in n)
    trainer.step(batch)
    assert mean_logprob(trainer, batch) == pytest.approx(first_step, abs=1e-6)
