"""`rlproxy train`: the trainer worker's settings; nested in them, `training` (core/settings/training.py), what
each step trains with. Their flags are flat like every other (`--learning-rate`)."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from core.policy_rules import BASE_POLICY, DEFAULT_POLICY, check_policy_name
from core.settings.base import CommandSettings
from core.settings.locations import DEFAULT_DATABASE_URL
from core.settings.prune import PRUNING_OFF, Pruning
from core.settings.redaction import Redaction
from core.settings.teacher import Teachers
from core.settings.training import TrainingSettings
from core.settings.urls import engine_urls

def demo_score_command(tasks: int = 48, seed: int = 0, concurrency: int = 8, python: str | None = None) -> str:
    """The bundled demo task's evaluation command (demo/score.py), as an `eval_command` template: what
    `gate="heldout"` stands for. It scores a policy on `tasks` problems of the split it is asked for."""
    return (f"{shlex.quote(python or sys.executable)} -m demo.score --base-url {{base_url}} --model {{model}} "
            f"--split {{split}} --tasks {tasks} --seed {seed} --concurrency {concurrency}")


DRAIN_SECONDS = 30.0  # TrainerSettings.drain_seconds' default, which a Publisher built in code also drains for

# How long one run of an evaluation command may take: the command gate's (`rlproxy train`) and `rlproxy eval`'s.
EvalTimeout = Annotated[float, Field(gt=0, description="Seconds one run of the evaluation command may take; then "
                                                       "it is killed (a gate's candidate is not promoted).")]
EVAL_TIMEOUT = 1800.0


class TrainerSettings(CommandSettings):
    """`rlproxy train`: the worker's settings, and under `training` what each step trains with."""

    database_url: str = Field(DEFAULT_DATABASE_URL, description="SQLAlchemy async URL of the store.")
    upstreams: tuple[str, ...] = Field(
        (), description="Engine base URL (no /v1) to load adapters into; repeat for every replica.",
        json_schema_extra={"flag": "upstream"})
    upstream_api_key: SecretStr | None = Field(
        None, description="Bearer key sent to the engines (vLLM --api-key): adapter loads and held-out evaluations.")
    model: Path | None = Field(None, description="Base model folder the engines serve; default: the bundled one.")
    adapters_dir: Path = Field(Path("rlproxy-adapters"), description="Where adapter versions are written.")
    worker_id: str = Field("trainer", description="Lease owner name; unique per trainer process.")
    policies: tuple[str, ...] = Field(
        (DEFAULT_POLICY,), description="The named policies this trainer trains, each from its own calls with the "
                                       "shared episode reward, in turn on one model copy (docs/policies.md). "
                                       "Calls of other policies are left untrained. Repeat the flag for each.",
        json_schema_extra={"flag": "policy"})
    poll_interval: float = Field(1.0, description="Seconds between looks for ready rollouts.")
    lease_seconds: float = Field(900.0, description="How long claimed rollouts stay reserved for one step.")
    drain_seconds: float = Field(
        DRAIN_SECONDS, ge=0,
        description="Seconds a version that stopped serving keeps its adapter on the engines before the trainer "
                    "unloads it, so the calls it was answering can finish. A call still running then (the proxy's "
                    "upstream_timeout allows 600 s) fails: raise it above your longest call if that matters; each "
                    "draining adapter holds one of the engine's max_loras.")
    metrics_port: int | None = Field(8401, description="Port for the trainer's Prometheus metrics; 0: off.")
    max_steps: int | None = Field(None, description="Stop after this many training steps (None: run forever).")
    gate: Literal["none", "canary", "eval-traffic", "command", "heldout"] = Field(
        "none",
        description="What a new adapter must pass before it serves (docs/gates.md). none: it serves at once; "
                    "canary: it answers canary_fraction of new rollouts and is promoted once canary_min_rollouts "
                    "of them have a mean reward not worse than the active policy's (same period) by more than "
                    "gate_margin, else retired; eval-traffic: the same on evaluation rollouts only "
                    "(eval_fraction of them); command: eval_command scores it and its parent, and it is promoted "
                    "unless it scores worse by more than gate_margin; heldout: the bundled demo task's command "
                    "(`python -m demo.score` on its gate split, heldout_tasks tasks). Training waits while a gate "
                    "decides.",
    )
    gate_margin: float = Field(0.1, ge=0, description="How much worse than the policy it would replace a "
                                                      "candidate may score and still be promoted (sampling noise; "
                                                      "in the units of the rewards or of the command's score).")
    eval_command: str | None = Field(
        None, description="The command gate's evaluation script, run through the shell with {base_url}, "
                          "{model}, {version} and {split} filled in; it prints one JSON line "
                          "{\"score\": x, \"n\": k} (docs/gates.md).")
    eval_timeout: EvalTimeout = EVAL_TIMEOUT
    eval_base_url: str | None = Field(
        None, description="Base URL (ending in /v1) eval_command is given; default: the first engine's. It must "
                          "serve every loaded adapter by name.")
    eval_fraction: float = Field(0.5, gt=0, lt=1, description="Share of new evaluation rollouts a candidate "
                                                              "answers under the eval-traffic gate.")
    canary_fraction: float = Field(0.1, gt=0, lt=1, description="Share of new rollouts the canary answers "
                                                                "(chosen by a hash of the rollout id).")
    canary_min_rollouts: int = Field(50, ge=1, description="Finished rollouts the canary and the active "
                                                           "policy must each have answered before the judge "
                                                           "decides (canary and eval-traffic gates).")
    reward_ttl_s: float = Field(
        21600.0, ge=0, description="Seconds after its creation a rollout may wait for its final reward; then it is "
                                   "marked expired: never trained on, further rewards refused with 409. 0: never.")
    pruning: Pruning = Field(
        PRUNING_OFF, description="Pruning between steps, as `rlproxy prune` does (0: off).",
        json_schema_extra={"prefix": "prune-", "was": {"older_than": "prune-older-than-s"}})
    heldout_tasks: int = Field(48, ge=1, description="Tasks per evaluation of the heldout gate (the demo task's "
                                                     "gate split).")
    nproc_per_node: int = Field(
        1, ge=1, description="Data-parallel training processes on this machine (one per GPU; on a CPU they share "
                             "its cores). Starts torchrun; for several machines run torchrun yourself "
                             "(trainer/parallel.py).")
    keep_versions: int = Field(
        5, ge=1, description="Adapter folders kept besides what serving and rollback need (each policy's active "
                             "version, its parent, candidates under evaluation): the newest this many of each "
                             "policy; older folders are removed once the engines unloaded them, their rows kept "
                             "(docs/retention.md). Optimizer state is kept only where training resumes from.")
    collective_timeout_s: float = Field(
        300.0, gt=0, description="With several ranks: seconds one collective of a step may wait for its peers, and "
                                 "how long a rank that is not heard from counts as alive; then every rank exits "
                                 "with a message naming the lost one, and torchrun or the chart restarts the job "
                                 "(docs/deploy.md). Idle waiting for the next step is not bounded by it, but a dead "
                                 "peer is noticed within it then too.")
    heartbeat_dir: Path | None = Field(
        None, description="A folder where every rank touches its file (rank-N) as its loop goes on; a liveness "
                          "probe that finds one older than it should be restarts the pod (helm/rlproxy). None: "
                          "no files.")
    reward: Literal["posted", "judge", "judge+posted"] = Field(
        "posted", description="Where final rewards come from (docs/judge.md). posted: only POST /reward; judge: "
                              "also an LLM judge, which scores the rollouts of a task group that got no posted "
                              "reward (a posted one is never judged); judge+posted: as judge, and rollouts with a "
                              "posted reward are judged with their group too, their reward becoming "
                              "judge_weight * judge + (1 - judge_weight) * posted.")
    redaction: Redaction = Field(default_factory=Redaction)
    judge_url: str | None = Field(
        None, description="OpenAI-compatible base URL (ending in /v1) of the judge; required by reward judge and "
                          "judge+posted. No default: the bundled base model judged at chance (docs/judge.md).")
    judge_model: str | None = Field(
        None, description="Model the judge is asked for; default: the first model the judge URL's /models lists "
                          "(an engine's base model).")
    judge_api_key: SecretStr | None = Field(
        None, description="Bearer key sent to the judge; default: upstream_api_key when judge_url is an engine's.")
    judge_rubric: Path | None = Field(
        None, description="Text file whose rubric replaces the built-in one (rewards/judge.py, DEFAULT_RUBRIC).")
    judge_idle_s: float = Field(
        600.0, gt=0, description="Seconds a rollout's agent must have been silent (no call, no reward, no span "
                                 "reward) before the judge may close it, still without a final reward; an agent "
                                 "running a tool or waiting on a long call is silent too, so keep it above both "
                                 "(600: the proxy's default upstream_timeout). Task groups are formed as for "
                                 "training (group_size, group_timeout_s).")
    judge_weight: float = Field(
        0.5, ge=0, le=1, description="Weight of the judge's score against a posted reward under judge+posted.")
    judge_attempts: int = Field(
        3, ge=1, description="Requests per group before the judge gives up on it (unreachable, or a reply that "
                             "breaks the JSON contract); an unjudged rollout expires by reward_ttl_s.")
    judge_timeout_s: float = Field(300.0, gt=0, description="Seconds one judge request may take.")
    judge_max_tokens: int | None = Field(
        None, gt=0, description="max_tokens of each judge request (None: the judge's own limit). A judge that "
                                "rambles on stops here, and its cut-off reply counts as bad output.")
    agreement_alarm_kl: float = Field(
        0.1, ge=0,
        description="ALERT when the served policy is not the trained one: per version, the KL per token between "
                    "the engine's log-probs of the calls it served (lag 0) and the trainer's of that version (k3 "
                    "estimate). Healthy engine/trainer numerics measured 0.003-0.08 per step on CPU vLLM, and those "
                    "steps included drift from their own updates; an engine serving other weights than the adapter "
                    "is far above it once a policy has moved. 0: no alarm (the metric is still exported).",
    )
    training: TrainingSettings = Field(TrainingSettings(), description="What each training step trains with.")
    distillation: Teachers = Field(default_factory=Teachers)  # a teacher per policy (core/settings/teacher.py)

    @model_validator(mode="before")
    @classmethod
    def _heldout_is_the_demo_command_gate(cls, given: Any) -> Any:
        """`heldout` is the command gate running the demo's scorer, for whoever builds these settings (the
        command line or code): every gate the worker knows is then one `build_gate` builds."""
        if isinstance(given, dict) and given.get("gate") == "heldout":
            tasks = given.get("heldout_tasks", cls.model_fields["heldout_tasks"].default)
            given = {**given, "gate": "command", "eval_command": demo_score_command(tasks=int(tasks))}
        return given

    @field_validator("upstreams")
    @classmethod
    def _engine_urls(cls, urls: tuple[str, ...]) -> tuple[str, ...]:
        return engine_urls(urls)

    @field_validator("policies")
    @classmethod
    def _trainable_policies(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        if not names:
            raise ValueError("name at least one policy to train")
        for name in names:
            if check_policy_name(name) == BASE_POLICY:
                raise ValueError(f"{BASE_POLICY!r} is the base model: it is never trained")
        return tuple(dict.fromkeys(names))

    @model_validator(mode="after")
    def _teachers_resolve(self) -> "TrainerSettings":
        """A teacher setting that names no teacher, or a context file that cannot be read, is refused at start."""
        self.distillation.resolve(self.policies)
        return self

    @field_validator("metrics_port")
    @classmethod
    def _zero_is_off(cls, port: int | None) -> int | None:
        return port or None
