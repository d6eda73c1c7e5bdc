"""Plain records passed from the proxy to the writer: what one policy call was, ready to store.

`CallRecord` is also an on-disk format: the spool keeps each call as its JSON, one line each
(proxy/recording/lines.py), and a proxy reads back the lines its previous version wrote. Add fields with a
default; never rename or remove one (old lines would no longer read and be set aside instead of stored).
tests/recording/test_spool_format.py reads a line an earlier release wrote."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any


@dataclass(slots=True)
class ChoiceRecord:
    index: int
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str | None = None


@dataclass(slots=True)
class CallRecord:
    """One policy call; its fields are the spool's line format (this module's opening says what that binds)."""

    id: str
    route: str  # "chat" | "completions"
    started_at: datetime
    rollout_id: str | None = None
    agent: str | None = None
    task_id: str | None = None
    project: str | None = None
    model: str | None = None
    upstream_model: str | None = None
    policy_version: int | None = None
    policy: str | None = None  # the named policy that answered (None: a model outside the policies)
    stream: bool = False
    status: str = "ok"
    http_status: int | None = None
    upstream: str | None = None
    request: dict[str, Any] | None = None
    response: dict[str, Any] | None = None
    error: str | None = None
    prompt_token_ids: list[int] | None = None
    choices: list[ChoiceRecord] = field(default_factory=list)
    latency_ms: float | None = None
    ttft_ms: float | None = None
    finished_at: datetime | None = None
    complete: bool = False  # a stream's end marker reached the agent (a disconnect after it loses nothing)
    eval: bool = False  # sent with `X-Rlproxy-Eval`: its rollout is evaluation traffic, never trained on
    # how it was sampled, as far as its log-probs depend on it (core/sampling_rules.py), e.g.
    # "temperature=0.7 top_p=0.95" or "logit_bias" (proxy/capture.py); None: temperature 1, whole vocabulary
    sampling: str | None = None
    logprobs_mode: str | None = None  # what the engine's log-probs are: 'processed' or 'raw' (--logprobs-mode)
    # what the operator's rollout sampling changed (core/rollout_sampling.py): {"rule", "asked": the agent's
    # values, "sent": the engine's}; None: the call went upstream with the agent's own sampling
    sampling_override: dict[str, Any] | None = None

    @property
    def completion_tokens(self) -> int | None:
        counts = [len(c.token_ids) for c in self.choices if c.token_ids is not None]
        return sum(counts) if counts else None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (for the spool file)."""
        data = asdict(self)
        data["started_at"] = self.started_at.isoformat()
        data["finished_at"] = self.finished_at.isoformat() if self.finished_at else None
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CallRecord":
        data = dict(data)
        data["started_at"] = datetime.fromisoformat(data["started_at"])
        data["finished_at"] = datetime.fromisoformat(data["finished_at"]) if data.get("finished_at") else None
        data["choices"] = [ChoiceRecord(**c) for c in data.get("choices") or []]
        return cls(**data)
