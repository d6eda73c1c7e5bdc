"""Typed settings, built once by the CLI from flags and `RLPROXY_*` environment variables, then passed down."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from core.air_rules import DEFAULT_ERROR_PATTERNS, AirRules
from core.policy_rules import BASE_POLICY, DEFAULT_POLICY, PolicyRules, check_policy_name

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///rlproxy.db"


def cache_dir() -> Path:
    """Where prepared models and adapters live unless told otherwise."""
    root = os.environ.get("RLPROXY_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rlproxy"
    )
    return Path(root)


class _Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DatabaseSettings(_Settings):
    database_url: str = Field(DEFAULT_DATABASE_URL, description="SQLAlchemy async URL of the store.")


class WriterSettings(_Settings):
    queue_size: int = Field(10_000, gt=0, description="Calls waiting for the database before the spool takes them.",
                            json_schema_extra={"flag": "writer-queue-size"})
    batch_size: int = Field(256, gt=0, description="Most rows the writer puts in one transaction.",
                            json_schema_extra={"flag": "writer-batch-size"})
    flush_interval: float = Field(0.02, ge=0, description="Seconds the writer waits to fill a batch.",
                                  json_schema_extra={"flag": "writer-flush-interval"})
    spool_path: Path = Field(
        Path("rlproxy-spool.jsonl"),
        description="Append-only file holding calls the database could not take yet; replayed in order.",
    )
    durability: Literal["spool", "sync", "batch"] = Field(
        "spool",
        description="spool: the call is appended to the spool (one write(), no fsync) before the agent gets its "
                    "answer, so a killed proxy loses no acknowledged call; only a machine crash can. sync: the "
                    "same, and fsynced (shared by concurrent calls): not even a machine crash loses one. batch: "
                    "answer the agent, then record the call (the spool covers database outages); a killed proxy "
                    "loses the calls the database had not taken.",
    )
    spool_segment_bytes: int = Field(4 << 20, description="Size at which the spool starts a new file.")


class AuthSettings(_Settings):
    """Who may call the proxy, how much, and what of their data is kept."""

    mode: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Require API keys. auto: when any key exists (an admin key or keys in the database), and a "
                    "non-loopback host without keys is refused; on: keys required; off: no keys checked anywhere.",
        json_schema_extra={"flag": "auth"},
    )
    admin_key: SecretStr | None = Field(None, description="Operator key: admin rights, no project scope.")
    key_cache_ttl: float = Field(
        30.0, description="Seconds a key lookup (found or not) is cached; also how long a revoked key may work.")
    rate_limit: float | None = Field(None, description="Requests per second per key (None: unlimited).")
    rate_burst: int | None = Field(None, description="Requests a key may send at once (default: the rate).")
    max_tokens: int | None = Field(None, description="Largest max_tokens / max_completion_tokens accepted.")
    max_n: int | None = Field(None, description="Largest n (completions per request) accepted.")
    redact_content: bool = Field(False, description="Store message and completion text as a marker "
                                                    "(token ids are kept).")
    upstream_api_key: SecretStr | None = Field(None, description="Bearer key the proxy sends to the engines.")


class ProxySettings(_Settings):
    host: str = Field("127.0.0.1", description="Interface to listen on.")
    port: int = Field(8400, description="Port to listen on.")
    upstreams: tuple[str, ...] = Field(
        (), description="OpenAI-compatible engine base URL without /v1; repeat for replicas. None given: `rlproxy "
                        "serve` starts a local engine.", json_schema_extra={"flag": "upstream"})
    database_url: str = Field(DEFAULT_DATABASE_URL, description="SQLAlchemy async URL of the store.")
    served_model: str | None = Field(
        None, description="Model name agents ask for; routed to the active policy. Default: the engine's base model."
    )
    migrate: bool = Field(True, description="Apply migrations on start.")
    client_max_size: int = Field(64 * 1024 * 1024, description="Largest request body accepted, in bytes.")
    upstream_timeout: float = Field(600.0, description="Seconds an upstream request may take in total.")
    upstream_connect_attempts: int = Field(3, description="Connection attempts per request before the first byte.")
    policy_refresh_interval: float = Field(1.0, description="Seconds between reads of the active policy.")
    policy_rules: tuple[str, ...] = Field(
        (), description="Which named policy answers a call, by agent and/or project, first match wins: "
                        "agent:NAME=POLICY, project:NAME=POLICY, project:A&agent:B=POLICY; POLICY `base` is the "
                        "base model, never trained (docs/policies.md). Repeat the flag for each rule.",
        json_schema_extra={"flag": "policy-rule"})
    default_policy: str = Field(
        DEFAULT_POLICY, description="The policy of a call no policy rule matches (`base`: the base model).")
    air: bool = Field(True, description="Derive automatic intermediate rewards from observed tool calls "
                                        "(docs/air.md).")
    air_invalid_arguments: float = Field(
        AirRules.invalid_arguments, description="AIR weight of a tool call whose arguments are not a JSON object "
                                                "(0: not emitted).")
    air_unknown_tool: float = Field(
        AirRules.unknown_tool, description="AIR weight of a call to a tool the request did not offer.")
    air_tool_error: float = Field(
        AirRules.tool_error, description="AIR weight of a tool result that reports an error, native or text.")
    air_tool_success: float = Field(
        AirRules.tool_success, description="AIR weight of tool_success, native and text tool calls (0: not emitted).")
    air_error_patterns: tuple[str, ...] = Field(
        DEFAULT_ERROR_PATTERNS, description="Regular expressions (case ignored) that, found in a native tool "
                                            "result, make it a tool_error; repeat the flag for each.",
        json_schema_extra={"split": False})
    air_text_action: str | None = Field(
        None, description="AIR for a text tool protocol (docs/air.md): a regex that marks a reply as a tool "
                          "call (e.g. 'CALC:'). Needs air_text_error and/or air_text_success. Default: off.")
    air_text_error: str | None = Field(
        None, description="A regex that, matched at the start of the user/tool turn answering a text tool "
                          "call, makes it a tool_error (e.g. 'ERROR:').")
    air_text_success: str | None = Field(
        None, description="A regex that, matched at the start of that turn, makes it a tool_success.")
    shutdown_timeout: float = Field(
        30.0, description="Seconds in-flight requests and streams may take to finish after SIGTERM."
    )
    writer: WriterSettings = Field(default_factory=WriterSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)

    @field_validator("default_policy")
    @classmethod
    def _policy_name(cls, name: str) -> str:
        return check_policy_name(name)

    @field_validator("policy_rules")
    @classmethod
    def _rules_parse(cls, rules: tuple[str, ...]) -> tuple[str, ...]:
        PolicyRules.parse(rules)  # raises with the rule and why
        return rules

    def routing(self) -> PolicyRules:
        return PolicyRules.parse(self.policy_rules, self.default_policy)


class EngineSettings(_Settings):
    model: Path | None = Field(None, description="Hugging Face model folder; default: the prepared bundled model.")
    host: str = Field("127.0.0.1", description="Interface the engine listens on.")
    port: int = Field(8000, description="Port the engine listens on.")
    served_model_name: str | None = Field(None, description="Name the engine serves the base model under.")
    max_lora_rank: int = Field(16, description="Largest LoRA rank the engine accepts.")
    max_loras: int = Field(4, description="Adapters resident at once (active, candidate, and draining ones).")
    max_model_len: int = Field(4096, description="Context length the engine allocates for.")
    kv_cache_gib: int = Field(2, description="KV cache size on CPU, GiB.")
    startup_timeout: float = Field(600.0, description="Seconds to wait for the engine to answer.")
    extra_args: tuple[str, ...] = Field((), description="One more argument passed to vLLM as it is (repeat).",
                                        json_schema_extra={"flag": "engine-arg", "split": False})


class TrainerSettings(_Settings):
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
    eval_timeout: float = Field(1800.0, gt=0, description="Seconds one run of eval_command may take; then it "
                                                          "is killed and the candidate is not promoted.")
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
    prune_older_than_s: float = Field(
        0.0, ge=0, description="Prune recorded data older than this many seconds, as `rlproxy prune` does "
                               "(trained, expired and finished evaluation rollouts; calls outside rollouts). 0: off.")
    prune_what: Literal["calls", "bodies"] = Field(
        "calls", description="What pruning removes: whole rollouts with their calls, or only the calls' request "
                             "and response bodies.")
    prune_keep_trained_ids: bool = Field(
        False, description="Pruning keeps the rows (token ids, logprobs, rewards) of trained rollouts and clears "
                           "only their bodies.")
    heldout_tasks: int = Field(48, ge=1, description="Tasks per evaluation of the heldout gate (the demo task's "
                                                     "gate split).")
    nproc_per_node: int = Field(
        1, ge=1, description="Data-parallel training processes on this machine (one per GPU; on a CPU they share "
                             "its cores). Starts torchrun; for several machines run torchrun yourself "
                             "(trainer/parallel.py).")
    reward: Literal["posted", "judge", "judge+posted"] = Field(
        "posted", description="Where final rewards come from (docs/judge.md). posted: only POST /reward; judge: "
                              "also an LLM judge, which scores the rollouts of a task group that got no posted "
                              "reward (a posted one is never judged); judge+posted: as judge, and rollouts with a "
                              "posted reward are judged with their group too, their reward becoming "
                              "judge_weight * judge + (1 - judge_weight) * posted.")
    redact_content: bool = Field(
        False, description="The proxies store text redacted (`rlproxy serve --redact-content`; one "
                           "RLPROXY_REDACT_CONTENT for every process says it once). The trainer then refuses to "
                           "start with a judge (reward judge or judge+posted), which could only read the marker.")
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

    @field_validator("policies")
    @classmethod
    def _trainable_policies(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        if not names:
            raise ValueError("name at least one policy to train")
        for name in names:
            if check_policy_name(name) == BASE_POLICY:
                raise ValueError(f"{BASE_POLICY!r} is the base model: it is never trained")
        return tuple(dict.fromkeys(names))

    @field_validator("metrics_port")
    @classmethod
    def _zero_is_off(cls, port: int | None) -> int | None:
        return port or None
