"""What `rlproxy demo` can be told: one dataclass, a help string per field; its flags are made from it
(rlproxy/commands/flags.py), and its training settings are the trainer's with the demo's own defaults."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from core.settings import DEFAULT_DATABASE_URL
from trainer.config import TrainConfig

AGENT = "demo"  # the agent being trained
PROBE_AGENT = "demo-heldout"  # held-out probes: evaluation rollouts, never training data


def demo_training() -> TrainConfig:
    """The trainer's defaults (a high LoRA rate, groups of 8, four updates per batch: trainer/config.py) with
    what is the demo's own: its agent's episodes alone are trained (never the held-out probes), and since it
    runs whole groups at a time, a group waits at most a minute and a step at most two for a full batch."""
    return TrainConfig(group_timeout_s=60.0, batch_timeout_s=120.0, train_agents=[AGENT])


@dataclass(frozen=True)
class DemoSettings:
    minutes: float = field(default=15.0, metadata={"help": "How long to train."})
    database_url: str = field(default=DEFAULT_DATABASE_URL, metadata={"help": "SQLAlchemy async URL of the store."})
    workdir: Path = field(default=Path("."), metadata={
        "help": "Where adapters, the demo state, the logs and the reward curve go."})
    engine_port: int = field(default=8000, metadata={"help": "Port of the local vLLM engine."})
    proxy_port: int = field(default=8400, metadata={"help": "Port of the proxy.", "flag": "port"})
    concurrency: int = field(default=8, metadata={"help": "Agent episodes in flight."})
    heldout: int = field(default=48, metadata={
        "help": "Held-out tasks per full evaluation (the base model's; every candidate's with --gate heldout)."})
    gate: Literal["probes", "heldout"] = field(default="probes", metadata={
        "help": "probes: new versions serve at once and a share of episodes are held-out probes that measure "
                "them; heldout: every candidate is evaluated on the held-out set before it may serve."})
    probe_share: float = field(default=0.25, metadata={
        "help": "With --gate probes: the share of episodes that are held-out probes (0 to 0.9)."})
    gate_margin: float = field(default=0.1, metadata={
        "help": "A candidate may score this much worse than its parent and still serve (sampling noise)."})
    task_seed: int = field(default=0, metadata={"help": "Seed of the agent's task draws."})
    train: TrainConfig = field(default_factory=demo_training, metadata={"help": "Training settings."})
    air: bool = field(default=True, metadata={"help": "Automatic intermediate rewards (the demo's text protocol)."})
    headless: bool = field(default=False, metadata={
        "help": "No live panel: a progress line every ~30 s and one per new version (also without a terminal)."})
    upstream: str | None = field(default=None, metadata={
        "help": "Use this running engine (base URL, runtime LoRA on) instead of starting one."})

    def __post_init__(self) -> None:
        if not 0.0 <= self.probe_share <= 0.9:
            raise ValueError(f"probe_share={self.probe_share}: expected 0 to 0.9")
