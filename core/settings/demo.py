"""`rlproxy demo`: the whole loop on the bundled model; its training settings are the trainer's, with the
demo's own defaults."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from core.settings.base import CommandSettings
from core.settings.locations import DEFAULT_DATABASE_URL
from core.settings.training import TrainingSettings
from core.settings.urls import engine_url

AGENT = "demo"  # the agent being trained
PROBE_AGENT = "demo-heldout"  # held-out probes: evaluation rollouts, never training data

# The trainer's defaults (a high LoRA rate, groups of 8, four updates per batch: core/settings/training.py) with
# what is the demo's own: its agent's episodes alone are trained (never the held-out probes), and since it
# runs whole groups at a time, a group waits at most a minute and a step at most two for a full batch.
DEMO_TRAINING = TrainingSettings(group_timeout_s=60.0, batch_timeout_s=120.0, train_agents=[AGENT])


class DemoSettings(CommandSettings):
    minutes: float = Field(15.0, description="How long to train.")
    database_url: str = Field(DEFAULT_DATABASE_URL, description="SQLAlchemy async URL of the store.")
    workdir: Path = Field(
        Path("."), description="Where adapters, the demo state, the logs and the reward curve go.")
    engine_port: int = Field(8000, description="Port of the local vLLM engine.")
    proxy_port: int = Field(8400, description="Port of the proxy.", json_schema_extra={"flag": "port"})
    concurrency: int = Field(8, description="Agent episodes in flight.")
    heldout: int = Field(
        48, description="Held-out tasks per full evaluation (the base model's; every candidate's with --gate "
                        "heldout).")
    gate: Literal["probes", "heldout"] = Field(
        "probes", description="probes: new versions serve at once and a share of episodes are held-out probes that "
                              "measure them; heldout: every candidate is evaluated on the held-out set before it "
                              "may serve.")
    probe_share: float = Field(
        0.25, ge=0, le=0.9,
        description="With --gate probes: the share of episodes that are held-out probes (0 to 0.9).")
    gate_margin: float = Field(
        0.1, ge=0, description="A candidate may score this much worse than its parent and still serve (sampling noise).")
    task_seed: int = Field(0, description="Seed of the agent's task draws.")
    air: bool = Field(True, description="Automatic intermediate rewards (the demo's text protocol).")
    headless: bool = Field(
        False, description="No live panel: a progress line every ~30 s and one per new version (also without a "
                           "terminal).")
    upstream: str | None = Field(
        None, description="Use this running engine (base URL, runtime LoRA on) instead of starting one.")
    training: TrainingSettings = Field(DEMO_TRAINING, description="Training settings.")

    @field_validator("upstream")
    @classmethod
    def _engine_url(cls, url: str | None) -> str | None:
        return None if url is None else engine_url(url)
