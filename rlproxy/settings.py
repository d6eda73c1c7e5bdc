"""Typed settings, built once by the CLI from flags and `RLPROXY_*` environment variables, then passed down."""
from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///rlproxy.db"


def cache_dir() -> Path:
    """Where prepared models and adapters live unless told otherwise."""
    import os

    root = os.environ.get("RLPROXY_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rlproxy"
    )
    return Path(root)


class _Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DatabaseSettings(_Settings):
    database_url: str = Field(DEFAULT_DATABASE_URL, description="SQLAlchemy async URL of the store.")


class WriterSettings(_Settings):
    queue_size: int = Field(10_000, description="Calls waiting for the database before the spool takes them.")
    batch_size: int = Field(256, description="Most rows written in one transaction.")
    flush_interval: float = Field(0.02, description="Seconds the writer waits to fill a batch.")
    spool_path: Path = Field(
        Path("rlproxy-spool.jsonl"),
        description="Append-only file holding calls the database could not take yet; replayed in order.",
    )


class ProxySettings(_Settings):
    host: str = Field("127.0.0.1", description="Interface to listen on.")
    port: int = Field(8400, description="Port to listen on.")
    upstreams: tuple[str, ...] = Field((), description="Base URLs (no /v1) of OpenAI-compatible engines.")
    database_url: str = Field(DEFAULT_DATABASE_URL, description="SQLAlchemy async URL of the store.")
    served_model: str | None = Field(
        None, description="Model name agents ask for; routed to the active policy. Default: the engine's base model."
    )
    migrate: bool = Field(True, description="Apply migrations on start.")
    client_max_size: int = Field(64 * 1024 * 1024, description="Largest request body accepted, in bytes.")
    upstream_timeout: float = Field(600.0, description="Seconds an upstream request may take in total.")
    upstream_connect_attempts: int = Field(3, description="Connection attempts per request before the first byte.")
    policy_refresh_interval: float = Field(1.0, description="Seconds between reads of the active policy.")
    air: bool = Field(True, description="Derive automatic intermediate rewards from observed tool calls.")
    writer: WriterSettings = Field(default_factory=WriterSettings)


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
    extra_args: tuple[str, ...] = Field((), description="More arguments passed to vLLM as they are.")


class TrainerSettings(_Settings):
    database_url: str = Field(DEFAULT_DATABASE_URL, description="SQLAlchemy async URL of the store.")
    upstreams: tuple[str, ...] = Field((), description="Engine base URLs (no /v1) to load adapters into.")
    model: Path | None = Field(None, description="Base model folder the engines serve; default: the bundled one.")
    adapters_dir: Path = Field(Path("rlproxy-adapters"), description="Where adapter versions are written.")
    worker_id: str = Field("trainer", description="Lease owner name; unique per trainer process.")
    poll_interval: float = Field(1.0, description="Seconds between looks for ready rollouts.")
    lease_seconds: float = Field(900.0, description="How long claimed rollouts stay reserved for one step.")
    metrics_port: int | None = Field(8401, description="Port for the trainer's Prometheus metrics; None: off.")
    max_steps: int | None = Field(None, description="Stop after this many training steps (None: run forever).")
