"""Trainer settings: one dataclass, a help string per field, defaults that learn on CPU without tuning."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal, get_args

CreditMode = Literal["identical", "discounted"]
AdvantageEstimator = Literal["grpo", "rloo", "reinforce_baseline", "reinforce"]
KlEstimator = Literal["k1", "k2", "k3"]
TokenSource = Literal["recorded", "retokenized"]
CREDIT_MODES = get_args(CreditMode)
ADVANTAGE_ESTIMATORS = get_args(AdvantageEstimator)
KL_ESTIMATORS = get_args(KlEstimator)
TOKEN_SOURCES = get_args(TokenSource)


@dataclass
class TrainConfig:
    # --- LoRA -------------------------------------------------------------------------------------
    lora_rank: int = field(default=8, metadata={"help": "LoRA rank r."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA alpha; the update is scaled by alpha / r."})
    lora_dropout: float = field(
        default=0.0,
        metadata={"help": "Dropout on the LoRA input. 0 keeps the policy deterministic, so the importance "
                          "ratio against the behaviour log-probs is not perturbed by noise."},
    )
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        metadata={"help": "Module names that get LoRA (vLLM supports attention and MLP projections)."},
    )
    lora_layers: int = field(
        default=0,
        metadata={"help": "Adapt only the top N transformer layers (0: all). Backpropagation then stops at the "
                          "lowest adapted layer, so a step costs less (see bench/train_step.py)."},
    )

    # --- optimisation -----------------------------------------------------------------------------
    learning_rate: float = field(
        default=1e-3,
        metadata={"help": "AdamW learning rate (LoRA params only). A high LoRA rate, with the PPO clip keeping each "
                          "update near the sampling policy: on the demo task 2e-4 with groups of 4 and one update "
                          "per batch gained 18 points in 15 minutes, 1e-3 with groups of 8 and 4 updates 60 "
                          "(docs/demo-tasks.md); the task families of bench/families/ are measured with these "
                          "defaults (docs/learning.md)."},
    )
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    max_grad_norm: float = field(
        default=1.0, metadata={"help": "Gradient clipping by global norm; 0 disables."}
    )
    ppo_epochs: int = field(default=1, metadata={"help": "Passes over each batch of transitions per step."})
    mini_batches: int = field(
        default=4,
        metadata={"help": "Optimizer updates per epoch: the batch is shuffled and split into this many shares, "
                          "one AdamW step each. More updates per batch learn more from each (expensive) batch of "
                          "episodes; the PPO clip keeps the later updates near the behaviour policy."},
    )
    micro_batch_tokens: int = field(
        default=0,
        metadata={"help": "Padded tokens (rows x longest row) per forward/backward; bounds peak memory. 0 picks "
                          "by device: 384 on CPU, 4096 on a GPU. A transition longer than this is a micro-batch of "
                          "its own, computed with activation checkpointing (memory stays bounded; that micro-batch "
                          "costs about 45% more). The bundled model in float32 needs about 1.2 MB per token; 384 "
                          "keeps the demo's transitions whole and its trainer under 2 GB, and its step takes no "
                          "longer than with 4096, which needed several GB (bench/memory.py)."},
    )
    max_seq_len: int = field(
        default=2048,
        metadata={"help": "Longest prompt + completion trained on; longer transitions are skipped."},
    )
    bf16: bool = field(
        default=True,
        metadata={"help": "Compute in bfloat16 (autocast) where the hardware does it fast: CUDA, or CPUs with "
                          "AVX512-BF16 or AMX. Elsewhere it is ignored and training runs in float32: on a plain "
                          "AVX2 CPU a bfloat16 matmul takes the slow reference path (~30x slower, measured)."},
    )
    seed: int = field(default=0, metadata={"help": "Seed for LoRA init and anything random in training."})
    num_threads: int = field(
        default=0,
        metadata={"help": "torch intra-op threads (process-wide); 0 keeps torch's default. On a CPU shared "
                          "with a vLLM engine, use fewer threads than cores: oversubscribed OpenMP threads "
                          "spin-wait on each other and a step can get several times slower."},
    )

    # --- memory: long contexts and models larger than one GPU -----------------------------------------
    activation_checkpointing: bool = field(
        default=False,
        metadata={"help": "Recompute each decoder layer's activations in backward for every micro-batch, keeping only "
                          "the layers' inputs: activation memory per token drops to about one hidden vector per "
                          "layer, for one more forward pass (~30-45% more compute). Off: only a transition longer "
                          "than micro_batch_tokens is computed this way."},
    )
    offload_base: bool = field(
        default=False,
        metadata={"help": "With the trainer under torchrun on GPUs (the base sharded over the ranks with FSDP2, "
                          "trainer/parallel.py): keep each rank's shard in CPU memory and copy it to the GPU layer "
                          "by layer, so GPU memory holds about one layer of the base at a time; every forward pass "
                          "then crosses PCIe. `rlproxy train` starts torchrun for it even with one GPU. No effect on "
                          "CPUs."},
    )

    # --- loss ---------------------------------------------------------------------------------------
    clip_eps_low: float = field(default=0.2, metadata={"help": "PPO ratio clip below: 1 - eps."})
    clip_eps_high: float = field(default=0.2, metadata={"help": "PPO ratio clip above: 1 + eps."})
    kl_coef: float = field(
        default=0.0,
        metadata={"help": "Weight of the KL(policy || base model) penalty. 0 skips the reference forward "
                          "pass (+26% CPU per step, measured); the LoRA rank and PPO clip bound drift."},
    )
    kl_estimator: KlEstimator = field(default="k3", metadata={"help": "KL estimator: k1, k2 or k3 (Schulman)."})
    track_ref_kl: bool = field(
        default=False,
        metadata={"help": "Measure KL to the base model even when kl_coef is 0 (costs the reference pass)."},
    )
    temperature: float = field(
        default=1.0,
        metadata={"help": "Logits are divided by this before log-probs. Must match how the recorded "
                          "behaviour log-probs were computed (vLLM's default raw logprobs: 1.0)."},
    )

    # --- pipeline (read by the worker) ------------------------------------------------------------
    batch_rollouts: int = field(
        default=16, metadata={"help": "Rewarded rollouts consumed per training step."}
    )
    group_size: int = field(
        default=8,
        metadata={"help": "Rollouts of the same task compared to compute advantages (a group of 4 at 30% success "
                          "is all failures a quarter of the time: no signal; 8 rarely is)."}
    )
    group_timeout_s: float = field(
        default=300.0,
        metadata={"help": "Seconds to wait for a group to fill before using it as is (if >= 2 members)."},
    )
    batch_timeout_s: float = field(
        default=0.0,
        metadata={"help": "Seconds the oldest ready rollout may wait for a full batch of batch_rollouts before a "
                          "smaller step runs (0: train on whatever is ready). Fewer, fuller steps mean fewer "
                          "adapter versions to publish and gate."},
    )
    max_staleness: int = field(
        default=2,
        metadata={"help": "Drop calls sampled by a policy more than this many versions behind the trainer."},
    )
    credit: CreditMode = field(
        default="identical",
        metadata={"help": "Credit per LLM call from the episode return: 'identical' (every call gets it) "
                          "or 'discounted' (gamma ** calls-until-the-end)."},
    )
    gamma: float = field(default=1.0, metadata={"help": "Discount for credit='discounted'."})
    advantage_estimator: AdvantageEstimator = field(
        default="grpo",
        metadata={"help": "grpo (group mean/std), rloo (leave-one-out mean), reinforce_baseline "
                          "(group mean, batch std), reinforce (raw return)."},
    )
    token_source: TokenSource = field(
        default="recorded",
        metadata={"help": "'recorded': the ids and log-probs the engine sampled (exact). 'retokenized': the "
                          "recorded text re-tokenized, behaviour log-probs recomputed by the trainer; an "
                          "ablation only (bench/learning.py), to measure what exact capture buys."},
    )
    train_agents: list[str] = field(
        default_factory=list, metadata={"help": "Agent names whose calls are trained; empty means all."}
    )
    eval_agents: list[str] = field(
        default_factory=list,
        metadata={"help": "Agent names whose rollouts are evaluation traffic (`rlproxy train --eval-agents`): "
                          "never trained on; the trainer marks them `eval` once finished, so `GET /policies` "
                          "reports their rewards per policy version."},
    )

    def __post_init__(self) -> None:
        self.target_modules = list(self.target_modules)
        self.train_agents = list(self.train_agents)
        self.eval_agents = list(self.eval_agents)
        checks = {
            "lora_rank": self.lora_rank > 0,
            "lora_alpha": self.lora_alpha > 0,
            "lora_dropout": 0.0 <= self.lora_dropout < 1.0,
            "lora_layers": self.lora_layers >= 0,
            "target_modules": bool(self.target_modules)
            and all(isinstance(m, str) for m in self.target_modules),
            "learning_rate": self.learning_rate > 0,
            "weight_decay": self.weight_decay >= 0,
            "max_grad_norm": self.max_grad_norm >= 0,
            "ppo_epochs": self.ppo_epochs >= 1,
            "mini_batches": self.mini_batches >= 1,
            "micro_batch_tokens": self.micro_batch_tokens >= 0,
            "num_threads": self.num_threads >= 0,
            "max_seq_len": self.max_seq_len > 1,
            "clip_eps_low": 0.0 < self.clip_eps_low < 1.0,
            "clip_eps_high": self.clip_eps_high > 0.0,
            "kl_coef": self.kl_coef >= 0,
            "kl_estimator": self.kl_estimator in KL_ESTIMATORS,
            "temperature": self.temperature > 0,
            "batch_rollouts": self.batch_rollouts >= 1,
            "group_size": self.group_size >= 1,
            "group_timeout_s": self.group_timeout_s >= 0,
            "batch_timeout_s": self.batch_timeout_s >= 0,
            "max_staleness": self.max_staleness >= 0,
            "credit": self.credit in CREDIT_MODES,
            "gamma": 0.0 < self.gamma <= 1.0,
            "advantage_estimator": self.advantage_estimator in ADVANTAGE_ESTIMATORS,
            "token_source": self.token_source in TOKEN_SOURCES,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError("invalid TrainConfig: " + ", ".join(f"{n}={getattr(self, n)!r}" for n in bad))

    @property
    def needs_reference(self) -> bool:
        """Whether a step runs the base-model (adapter disabled) forward pass."""
        return self.kl_coef > 0 or self.track_ref_kl

    @classmethod
    def help(cls) -> dict[str, str]:
        """Field name -> help text (for CLIs and docs)."""
        return {f.name: f.metadata.get("help", "") for f in fields(cls)}
