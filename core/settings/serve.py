"""`rlproxy serve`: the proxy's settings, with its writer's and its access control's."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator

from core.air_rules import DEFAULT_ERROR_PATTERNS, AirRules
from core.policy_rules import DEFAULT_POLICY, PolicyRules, check_policy_name
from core.rollout_sampling import RolloutSampling
from core.settings.base import CommandSettings, Part
from core.settings.ingest import IngestSettings
from core.settings.locations import DEFAULT_DATABASE_URL
from core.settings.redaction import Redaction
from core.settings.urls import engine_urls


class WriterSettings(Part):
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
    rejected_max_bytes: int = Field(
        256 << 20, gt=0,
        description="Largest size, in bytes, of the file of calls the database refused (<spool>.rejected.jsonl); "
                    "past it such a call is only logged, by id (any key can send one: a NUL in its text).")
    spool_segment_bytes: int = Field(
        4 << 20, description="Size at which the spool starts a new file (an eighth of the free space when less).")


class AuthSettings(Part):
    """Who may call the proxy, how much, and what of their data is kept."""

    mode: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Require API keys. auto: when any key exists (an admin key or keys in the database), and a "
                    "non-loopback host without keys is refused; on: keys required; off: no keys checked anywhere.",
        json_schema_extra={"flag": "auth"},
    )
    admin_key: SecretStr | None = Field(None, description="Operator key: admin rights, no project scope.")
    key_cache_ttl: float = Field(
        30.0, description="Seconds a key lookup (found or not) is cached; also how long a revoked key may work, "
                          "and how long a rollout's owner is remembered (a pruned id another project opens again "
                          "is its own on this proxy after at most this long).")
    key_lookup_rate: float = Field(
        20.0, gt=0,
        description="Database look-ups of keys this proxy has not found valid before, per second per client "
                    "address (bursts of five seconds' worth); past it, 429. A flood of made-up keys otherwise "
                    "reaches the database once each, before any rate limit (which is a key's: it applies only once "
                    "a key is known). A key found valid before is looked up again without it when its cache entry "
                    "expires, so a flood from an address other projects' agents share does not turn them away.")
    rate_limit: float | None = Field(None, description="Requests per second per key (None: unlimited).")
    rate_burst: int | None = Field(None, description="Requests a key may send at once (default: the rate).")
    max_open_per_key: int = Field(
        256, ge=0, description="Requests one key may have open at once, streams included; past it, 429 with "
                               "Retry-After until one ends. The rate limit counts requests as they start, so 2 "
                               "requests/s held 30 streams open after 15 s. 0: no bound.")
    max_tokens: int | None = Field(
        None, description="Largest max_tokens / max_completion_tokens / max_output_tokens accepted; a call "
                          "without one is sent with max_tokens set to this (completions: to the lower of this "
                          "and 16), and min_tokens above it is refused.")
    max_n: int | None = Field(
        128, ge=0, description="Largest n (completions per request) accepted; past it, 400 naming the field. 0: no "
                               "bound (one call of n=20000 made every tenant wait while its answer was captured).")
    upstream_api_key: SecretStr | None = Field(None, description="Bearer key the proxy sends to the engines.")


class ProxySettings(CommandSettings):
    host: str = Field("127.0.0.1", description="Interface to listen on.")
    project_bytes_per_hour: int = Field(
        8 * 2**30, ge=0,
        description="Bytes one project's keys may make this proxy store per hour (call requests and answers, "
                    "rollout metadata, events, rewards; bursts up to an hour's worth); past it, 429 with "
                    "Retry-After, and what was accepted is stored whole. Per proxy process. 0: no bound.")
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
    max_inflated_size: int = Field(
        16 * 1024 * 1024, gt=0,
        description="Largest size, in bytes, a compressed request body (Content-Encoding gzip or deflate) may "
                    "inflate to; never more than --client-max-size. Inflating stops, and the request is 413, as "
                    "soon as it is passed.")
    max_inflation_ratio: float = Field(
        100.0, gt=1,
        description="Most times its compressed size a compressed request body may inflate to (checked once it "
                    "passes 1 MiB): a compression bomb is 413 after a few milliseconds of work.")
    allow_request_fields: tuple[str, ...] = Field(
        (), description="A request field to pass to the engine on every route besides those each route takes "
                        "(docs/contract.md), e.g. one of vLLM's refused on purpose (priority, request_id, "
                        "kv_transfer_params, chat_template, ...) where every key is trusted with it; repeat the "
                        "flag for each.", json_schema_extra={"flag": "allow-request-field"})
    allow_media_urls: bool = Field(
        False, description="Pass image, video and audio parts given by an http(s) or file URL to the engine, which "
                           "fetches them from wherever they point (vLLM allows every domain unless started with "
                           "--allowed-media-domains). Off: such a part is refused (400 media_url_refused); media "
                           "sent inline as a data: URL always passes.")
    engine_logprobs_mode: Literal["processed", "raw"] = Field(
        "processed", description="What the engines' log-probs are (vLLM --logprobs-mode): `processed` "
                                 "(processed_logprobs, as rlproxy engine, serve, demo and the chart run them: the "
                                 "probabilities tokens were sampled with) or `raw` (vLLM's default: before "
                                 "temperature and top-k/top-p; only temperature-1, untruncated calls are then "
                                 "trained). Recorded on each call.")
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
    rollout_version_hold: float = Field(
        0.0, ge=0,
        description="Seconds a running rollout keeps the policy version its first call got after a newer version "
                    "starts serving, so that the engine's prefix cache (kept per adapter) still holds its context; "
                    "then it moves to the newest. 0: every call gets the newest version (on-policy). Keep it under "
                    "the trainer's --drain-seconds (30): a version is unloaded that long after it stops serving "
                    "(docs/learning.md, Which version a running rollout gets).")
    rollout_sampling: tuple[str, ...] = Field(
        (), description="Sample training rollouts' calls with these parameters instead of the agent's: "
                        "[policy:NAME/|agent:NAME/]FIELD=VALUE[,...], FIELD temperature (0.01-2), top_p or top_k, "
                        "e.g. temperature=1.0 or agent:aider/temperature=1.0,top_p=1.0; the first rule that holds "
                        "applies. Evaluation rollouts and calls without a rollout are never changed; each changed "
                        "call records the agent's request and what was changed (`sampling_override`). A greedy "
                        "agent (temperature 0) repeats one attempt and cannot learn without it. Repeat the flag "
                        "for each rule.", json_schema_extra={"flag": "rollout-sampling", "split": False,
                                                             "metavar": "[SCOPE/]FIELD=VALUE,..."})
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
    header_timeout: float = Field(
        60.0, gt=0,
        description="Seconds a connection may go without sending a whole request head (its request line and "
                    "headers), counted from when it opened or its last answer ended: then it is closed. This is "
                    "also how long an idle kept-alive connection is kept; behind a load balancer that reuses "
                    "connections, set it above the balancer's idle timeout.")
    body_timeout: float = Field(
        120.0, gt=0,
        description="Seconds a request body may take to arrive after its head: past it the request is 408 and its "
                    "connection closed (a slow sender holds no connection or memory longer).")
    max_connections: int = Field(
        4096, ge=1,
        description="Most client connections held open at once; one more is answered 503 (`too_many_connections`, "
                    "Retry-After) and closed. Bounds the file descriptors and memory idle or slow connections can "
                    "take, so the store, the spool and the engines keep theirs; keep it under the process's open "
                    "files limit (`ulimit -n`) with room for those.")
    shutdown_timeout: float = Field(
        30.0, description="Seconds in-flight requests and streams may take to finish after SIGTERM."
    )
    writer: WriterSettings = Field(default_factory=WriterSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    redaction: Redaction = Field(default_factory=Redaction)
    ingest: IngestSettings = Field(default_factory=IngestSettings)

    @field_validator("default_policy")
    @classmethod
    def _policy_name(cls, name: str) -> str:
        return check_policy_name(name)

    @field_validator("upstreams")
    @classmethod
    def _engine_urls(cls, urls: tuple[str, ...]) -> tuple[str, ...]:
        return engine_urls(urls)

    @field_validator("policy_rules")
    @classmethod
    def _rules_parse(cls, rules: tuple[str, ...]) -> tuple[str, ...]:
        PolicyRules.parse(rules)  # raises with the rule and why
        return rules

    @field_validator("rollout_sampling")
    @classmethod
    def _sampling_parses(cls, rules: tuple[str, ...]) -> tuple[str, ...]:
        RolloutSampling.parse(rules)  # raises with the rule and why
        return rules

    def sampling_rules(self) -> RolloutSampling:
        return RolloutSampling.parse(self.rollout_sampling)

    def routing(self) -> PolicyRules:
        return PolicyRules.parse(self.policy_rules, self.default_policy, self.rollout_version_hold)
