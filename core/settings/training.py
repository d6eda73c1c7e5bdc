"""The training settings proper (LoRA, optimisation, loss, pipeline): what the policy trainer, the batch builder
and `rlproxy export` read, what `rlproxy train-config` lists, what the demo trains with (defaults of its own:
core/settings/demo.py) and what a saved adapter records beside itself. Nested in `rlproxy train`'s settings
(core/settings/train.py); their flags are flat like every other (`--learning-rate`).

Defaults that learn on CPU without tuning."""
from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic.dataclasses import dataclass

CreditMode = Literal["identical", "discounted"]
AdvantageEstimator = Literal["grpo", "rloo", "reinforce_baseline", "reinforce"]
KlEstimator = Literal["k1", "k2", "k3"]
ProximalPolicy = Literal["recomputed", "behaviour"]
CorrectionLevel = Literal["off", "token", "seq"]
CorrectionMode = Literal["mask", "clip"]
CorrectionGating = Literal["ratio", "binary_kl", "tv"]
PolicyLossType = Literal["ppo", "gspo"]
TokenSource = Literal["recorded", "retokenized"]
ChoicesTrained = Literal["continued", "all"]
Mesh = Literal["auto", "fsdp", "hsdp", "ddp"]


# A dataclass (pydantic's: validated like the models), as the policy trainer copies it with one value changed
# (dataclasses.replace) and saves it beside an adapter (dataclasses.asdict).
@dataclass(frozen=True, kw_only=True, config=ConfigDict(extra="forbid"))
class TrainingSettings:
    # --- LoRA -------------------------------------------------------------------------------------
    lora_rank: int = Field(8, gt=0, description="LoRA rank r.")
    lora_alpha: int = Field(16, gt=0, description="LoRA alpha; the update is scaled by alpha / r.")
    lora_dropout: float = Field(
        0.0, ge=0, lt=1,
        description="Dropout on the LoRA input. 0 keeps the policy deterministic, so the importance "
                    "ratio against the behaviour log-probs is not perturbed by noise (required with "
                    "proximal_policy=recomputed, whose no-grad pass would draw masks of its own).",
    )
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1,
        description="Module names that get LoRA, checked against the model's architecture (a name it lacks is "
                    "refused); [\"auto\"]: every attention and dense MLP projection it has, mixture-of-experts "
                    "experts and routers left out (trainer/lora_targets.py).",
    )
    lora_layers: int = Field(
        0, ge=0,
        description="Adapt only the top N transformer layers (0: all). Backpropagation then stops at the "
                    "lowest adapted layer, so a step costs less (see bench/train_step.py).",
    )

    # --- optimisation -----------------------------------------------------------------------------
    learning_rate: float = Field(
        1e-3, gt=0,
        description="AdamW learning rate (LoRA params only). A high LoRA rate, with the PPO clip keeping each "
                    "update near the sampling policy: on the demo task 2e-4 with groups of 4 and one update "
                    "per batch gained 18 points in 15 minutes, 1e-3 with groups of 8 and 4 updates 60 "
                    "(docs/demo-tasks.md); the task families of bench/families/ are measured with these "
                    "defaults (docs/learning.md).",
    )
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    max_grad_norm: float = Field(
        1.0, ge=0, description="Gradient clipping by global norm; 0 disables."
    )
    ppo_epochs: int = Field(1, ge=1, description="Passes over each batch of transitions per step.")
    mini_batches: int = Field(
        4, ge=1,
        description="Optimizer updates per epoch: the batch is shuffled and split into this many shares, "
                    "one AdamW step each. More updates per batch learn more from each (expensive) batch of "
                    "episodes; the PPO clip keeps the later updates near the behaviour policy.",
    )
    micro_batch_tokens: int = Field(
        0, ge=0,
        description="Padded tokens (rows x longest row) per forward/backward; bounds peak memory. 0 picks "
                    "by device: 384 on CPU, 4096 on a GPU. A transition longer than this is a micro-batch of "
                    "its own, computed with activation checkpointing (memory stays bounded; that micro-batch "
                    "costs about 45% more). The bundled model in float32 needs about 1.2 MB per token; 384 "
                    "keeps the demo's transitions whole and its trainer under 2 GB, and its step takes no "
                    "longer than with 4096, which needed several GB (bench/memory.py).",
    )
    max_seq_len: int = Field(
        0, ge=0,
        description="Longest prompt + completion trained on; longer calls are skipped (too_long). 0: the engines' "
                    "own max_model_len (read from their model lists at start), so no call they served is dropped "
                    "for its length; one longer than micro_batch_tokens is trained as a micro-batch of its own.",
    )
    bf16: bool = Field(
        True,
        description="Compute in bfloat16 (autocast) where the hardware does it fast: CUDA, or CPUs with "
                    "AVX512-BF16 or AMX. Elsewhere it is ignored and training runs in float32: on a plain "
                    "AVX2 CPU a bfloat16 matmul takes the slow reference path (~30x slower, measured).",
    )
    seed: int = Field(0, description="Seed for LoRA init and anything random in training.")
    num_threads: int = Field(
        0, ge=0,
        description="torch intra-op threads (process-wide); 0 keeps torch's default. On a CPU shared "
                    "with a vLLM engine, use fewer threads than cores: oversubscribed OpenMP threads "
                    "spin-wait on each other and a step can get several times slower.",
    )

    # --- memory: long contexts and models larger than one GPU -----------------------------------------
    activation_checkpointing: bool = Field(
        False,
        description="Recompute each decoder layer's activations in backward for every micro-batch, keeping only "
                    "the layers' inputs: activation memory per token drops to about one hidden vector per layer, "
                    "for one more forward pass (~30-45% more compute). Off: only a transition longer than "
                    "micro_batch_tokens is computed this way.")
    offload_base: bool = Field(
        False,
        description="With the trainer under torchrun on GPUs (the base sharded over the ranks with FSDP2, "
                    "trainer/parallel.py): keep each rank's shard in CPU memory and copy it to the GPU layer by "
                    "layer, so GPU memory holds about one layer of the base at a time; every forward pass then "
                    "crosses PCIe. `rlproxy train` starts torchrun for it even with one GPU. No effect on CPUs.")
    mesh: Mesh = Field(
        "auto",
        description="How several ranks hold the base (trainer/sharding.py). fsdp: each rank 1/N of it, gathered "
                    "layer by layer for every pass; hsdp: sharded within a node (LOCAL_WORLD_SIZE ranks) and "
                    "replicated across nodes, so the gathers stay inside a node and only the LoRA gradients "
                    "cross; ddp: a whole copy on every rank, nothing gathered (the base must fit one device "
                    "beside its activations). auto: ddp on GPUs where the bf16 base takes under a third of a "
                    "device, else hsdp across several nodes, else fsdp (always fsdp on CPUs).")

    # --- loss ---------------------------------------------------------------------------------------
    clip_eps_low: float = Field(0.2, gt=0, lt=1, description="PPO ratio clip below: 1 - eps.")
    clip_eps_high: float = Field(0.2, gt=0, description="PPO ratio clip above: 1 + eps.")
    dual_clip: float = Field(
        3.0, ge=0,
        description="Dual-clip PPO (Ye et al. 2020): the loss of a token with a negative advantage is bounded by "
                    "dual_clip x |advantage|, however far its ratio has risen; PPO's own clip does not bound that "
                    "side. Must be above 1; 0 turns it off. 3 is the paper's value (and OpenRLHF's, verl's).",
    )
    policy_loss_type: PolicyLossType = Field(
        "ppo",
        description="ppo: a ratio per token. gspo: one ratio per sequence, the geometric mean of its tokens' "
                    "(GSPO), and a loss per sequence. With proximal_policy=recomputed it needs "
                    "is_correction_level=off (OpenRLHF's GSPO with a correction takes its ratio against the engine's "
                    "log-probs and applies no weight, dropping the proximal policy).",
    )
    proximal_policy: ProximalPolicy = Field(
        "recomputed",
        description="What the PPO ratio is taken against (docs/learning.md, Off-policy correction). recomputed: "
                    "decoupled PPO, the trainer's own log-probs of the batch before the step's first update (free "
                    "for the first mini-batch: the same forward pass; one no-grad pass over the other mini-batches), "
                    "the engine's log-probs used only for the importance weight below. behaviour: the ratio against "
                    "the engine's log-probs, no importance weight (how steps were computed before; the ratio then "
                    "mixes staleness, engine numerics and the step's own updates).",
    )
    is_correction_level: CorrectionLevel = Field(
        "token",
        description="Importance weight trainer/engine (proximal log-probs against the engine's sampling ones, "
                    "OpenRLHF's PolicyLoss): token (one weight per token, TIS), seq (one gate per sequence: the "
                    "geometric mean of its ratios), off (no weight: stale calls are trained as if on-policy). "
                    "Ignored with proximal_policy=behaviour.",
    )
    is_correction_mode: CorrectionMode = Field(
        "clip",
        description="clip: the token weight is clamped into is_correction_low..is_correction_high (truncated IS, TIS); needs "
                    "level token and gating ratio. mask: units outside the band are dropped from the loss, the "
                    "others keep their weight (ICEPOP at token level, seq-mask-TIS at seq level).",
    )
    is_correction_gating: CorrectionGating = Field(
        "ratio",
        description="What the band bounds: ratio (the weight itself), or binary_kl / tv (the sampled token's "
                    "binary KL or total variation between engine and trainer: a trust region, upper bound only, "
                    "so is_correction_low must then be 0).",
    )
    is_correction_low: float = Field(
        0.5, ge=0,
        description="Lower end of the correction's band (is_correction_threshold in OpenRLHF): a token the trainer "
                    "finds less likely than the engine did counts with at least this weight (clip) or is dropped "
                    "(mask). Must be 0 with gating binary_kl or tv.",
    )
    is_correction_high: float = Field(
        2.0, gt=0,
        description="Upper end of the band: the cap on the importance weight (clip) or the largest one kept (mask); "
                    "the divergence bound with gating binary_kl or tv. 2 is Agent Lightning's recommended TIS cap; "
                    "wider bands (OpenRLHF's 5) let stale calls count more, with more variance.",
    )
    kl_coef: float = Field(
        0.0, ge=0,
        description="Weight of the KL(policy || base model) penalty. 0 skips the reference forward "
                    "pass (+26% CPU per step, measured); the LoRA rank and PPO clip bound drift.",
    )
    kl_estimator: KlEstimator = Field("k3", description="KL estimator: k1, k2 or k3 (Schulman).")
    track_ref_kl: bool = Field(
        False,
        description="Measure KL to the base model even when kl_coef is 0 (costs the reference pass).",
    )
    temperature: float = Field(
        1.0, gt=0,
        description="The temperature of calls recorded without one (vLLM's default is 1.0: change it only for "
                    "engines started with another default sampling temperature). A call sampled at its own "
                    "temperature, top_p or top_k is scored at those (docs/learning.md).",
    )
    yield_window: int = Field(
        10, ge=1, description="Steps over which a policy's yield is watched for the yield ALERTs.")
    yield_alert_share: float = Field(
        0.5, ge=0, le=1,
        description="ALERT when more than this share of a policy's calls over the last yield_window steps was not "
                    "trained for one reason (the line names the reason and what fixes it), and when more than this "
                    "share of its task groups is greedy (temperature 0, or every attempt the same). 0: no ALERT.")

    # --- pipeline (read by the worker) ------------------------------------------------------------
    batch_rollouts: int = Field(
        16, ge=1,
        description="Rewarded rollouts consumed per training step. learning_rate is the rate of a step over this "
                    "many: a step that trains fewer (what was ready, less the calls dropped as stale) takes the "
                    "rate in proportion (scale_lr_to_batch).",
    )
    scale_lr_to_batch: bool = Field(
        True,
        description="A step over fewer than batch_rollouts rollouts (what was ready, less those whose every call "
                    "was dropped as stale; a group with one reward for all still counts) takes learning_rate x "
                    "rollouts / batch_rollouts (the linear scaling rule). Off: every step takes the full rate, so a "
                    "step on a single late group, or what staleness left of a batch, moves the adapter as far as a "
                    "full one (AdamW's update hardly depends on how much the gradient averaged over).",
    )
    max_batch_rollouts: int = Field(
        64, ge=1,
        description="Most rollouts one step takes when more complete groups than batch_rollouts are waiting (traffic "
                    "that runs ahead of the trainer): the backlog is trained in one larger step, with as many "
                    "optimizer updates as its batches would have had (mini_batches per batch_rollouts), rather "
                    "than left in the queue to grow stale. Never below batch_rollouts; equal to it, every step takes one "
                    "batch (docs/learning.md, Learning from traffic that does not wait).",
    )
    group_size: int = Field(
        8, ge=1,
        description="Rollouts of the same task compared to compute advantages (a group of 4 at 30% success "
                    "is all failures a quarter of the time: no signal; 8 rarely is)."
    )
    group_timeout_s: float = Field(
        300.0, ge=0,
        description="Seconds to wait for a group to fill before using it as is (if >= 2 members).",
    )
    batch_timeout_s: float = Field(
        0.0, ge=0,
        description="Seconds the oldest ready rollout may wait for a full batch of batch_rollouts before a "
                    "smaller step runs (0: train on whatever is ready). Fewer, fuller steps mean fewer "
                    "adapter versions to publish and gate.",
    )
    settle_s: float = Field(
        0.0, ge=0,
        description="Seconds a rollout waits after its final reward before a step may take it. With several "
                    "proxies the reward can reach one while the rollout's last calls are still in another's "
                    "writer queue (4-9 s under load, docs/scale.md): taken at once, the trajectory would train "
                    "without them. One proxy stores its own calls before it acknowledges a reward, so 0 is safe "
                    "there; the Helm chart sets 15 when proxy.replicas > 1. Calls that arrive after their "
                    "rollout was trained are counted (rlproxy_capture_late_calls_total).",
    )
    max_staleness: int = Field(
        8, ge=0,
        description="Drop calls sampled by a policy more than this many versions behind the trainer. The "
                    "importance weight (is_correction_level) corrects for the lag, so traffic that ran ahead of the "
                    "trainer is trained rather than thrown away; the bound keeps the weights of very old calls, "
                    "mostly clipped anyway, from filling a batch. Dropped calls are counted by lag per step.",
    )
    credit: CreditMode = Field(
        "identical",
        description="Credit per LLM call from the episode return: 'identical' (every call gets it) "
                    "or 'discounted' (gamma ** calls-until-the-end).",
    )
    gamma: float = Field(1.0, gt=0, le=1, description="Discount for credit='discounted'.")
    advantage_estimator: AdvantageEstimator = Field(
        "grpo",
        description="grpo (group mean/std), rloo (leave-one-out mean), reinforce_baseline "
                    "(group mean, batch std), reinforce (raw return).",
    )
    token_source: TokenSource = Field(
        "recorded",
        description="'recorded': the ids and log-probs the engine sampled (exact). 'retokenized': the "
                    "recorded text re-tokenized, behaviour log-probs recomputed by the trainer; an "
                    "ablation only (bench/learning.py), to measure what exact capture buys.",
    )
    choices_trained: ChoicesTrained = Field(
        "continued",
        description="A call answered with several choices (n > 1): 'continued' trains only the choice the agent "
                    "went on from (the first later call of that agent whose prompt extends this one holds that "
                    "choice's tokens), since the outcome followed from it; a call no later call continues (a final best-of-n pick, answers re-rendered as text) "
                    "cannot say which choice earned the reward and is skipped as choice_not_continued. 'all': "
                    "every choice with the rollout's advantage, for agents whose outcome rests on all of them "
                    "(a majority vote over the n answers).",
    )
    train_agents: list[str] = Field(
        default_factory=list, description="Agent names whose calls are trained; empty means all."
    )
    eval_agents: list[str] = Field(
        default_factory=list,
        description="Agent names whose rollouts are evaluation traffic (`rlproxy train --eval-agents`): "
                    "never trained on; the trainer marks them `eval` once finished, so `GET /policies` "
                    "reports their rewards per policy version.",
    )

    @field_validator("dual_clip")
    @classmethod
    def _dual_clip_above_one(cls, value: float) -> float:
        if value and value <= 1:
            raise ValueError("dual_clip must be above 1 (or 0: off)")
        return value

    @model_validator(mode="after")
    def _proximal_pass_is_the_policy(self) -> "TrainingSettings":
        """Settings under which the recomputed proximal policy would not be the policy the ratio assumes."""
        if self.proximal_policy != "recomputed":
            return self
        if self.lora_dropout > 0:
            raise ValueError("lora_dropout > 0 with proximal_policy=recomputed: the no-grad proximal pass draws its own "
                             "dropout masks, so the ratio and the importance weight carry noise; set lora_dropout=0")
        if self.policy_loss_type == "gspo" and self.is_correction_level != "off":
            raise ValueError("policy_loss_type=gspo with is_correction_level on: OpenRLHF's GSPO then takes its "
                             "sequence ratio against the engine's log-probs and applies no weight, dropping the "
                             "recomputed proximal policy; set is_correction_level=off (ratio against the proximal "
                             "policy) or proximal_policy=behaviour")
        return self

    @model_validator(mode="after")
    def _correction_fits_together(self) -> "TrainingSettings":
        """The combinations OpenRLHF's PolicyLoss refuses, refused here with the settings' names."""
        if self.is_correction_low >= self.is_correction_high:
            raise ValueError("is_correction_low must be below is_correction_high")
        if self.is_correction_level == "off" or self.proximal_policy == "behaviour":
            return self
        if self.is_correction_mode == "clip" and (self.is_correction_level != "token"
                                                   or self.is_correction_gating != "ratio"):
            raise ValueError("is_correction_mode=clip needs is_correction_level=token and is_correction_gating=ratio"
                             " (a sequence statistic or a divergence can only mask)")
        if self.is_correction_gating != "ratio" and self.is_correction_low > 0:
            raise ValueError(f"is_correction_gating={self.is_correction_gating} takes an upper bound only: "
                             "set is_correction_low to 0 and is_correction_high to the bound")
        return self

    @property
    def step_rollouts_cap(self) -> int:
        """The most rollouts one step takes (max_batch_rollouts, never below batch_rollouts)."""
        return max(self.batch_rollouts, self.max_batch_rollouts)

    def updates_for(self, rollouts: int) -> int:
        """Optimizer updates per epoch for a step over `rollouts`: mini_batches per batch of batch_rollouts (to the
        nearest whole batch, at least one), so a mini-batch stays about the size a regular step's is."""
        return self.mini_batches * max(1, int(rollouts / self.batch_rollouts + 0.5))  # halves up (round() goes to even)

    def lr_scale_for(self, rollouts: int) -> float:
        """A step over fewer than batch_rollouts trained rollouts takes a learning rate in proportion (the linear
        scaling rule): AdamW moves the weights about as far on one transition as on a batch, so a step on what a
        few late groups left after stale calls were dropped would otherwise be a full-size step of noise."""
        return min(1.0, rollouts / self.batch_rollouts) if self.scale_lr_to_batch else 1.0

    @property
    def needs_reference(self) -> bool:
        """Whether a step runs the base-model (adapter disabled) forward pass."""
        return self.kl_coef > 0 or self.track_ref_kl
