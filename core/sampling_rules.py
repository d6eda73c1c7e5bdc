"""What `calls.sampling` says about how a call was sampled, written by the proxy (proxy/capture.py) and read by
the trainer (trainer/sampled.py).

The column holds either nothing (vLLM's neutral sampling: temperature 1, no truncation), the settings the trainer
reproduces from its own logits (`temperature=0.7 top_p=0.95 top_k=20`, each named only when not neutral), or
the first field that changed the distribution in a way the trainer cannot reproduce (`logit_bias`,
`presence_penalty=0.5`, `response_format=json_schema`, ...).

What the recorded log-probs mean depends on the engine's `--logprobs-mode` (`calls.logprobs_mode`): with
'processed' they are the probabilities the tokens were sampled with, after temperature and top-k/top-p; with
'raw' (and on calls recorded before the column existed: None) they are the log-softmax before them, and any
non-neutral setting makes them something else than the behaviour policy.
"""
from __future__ import annotations

from dataclasses import dataclass

PROCESSED = "processed"
RAW = "raw"
# vLLM 0.32 samples a temperature above 0 and below this at this (vllm/sampling_params.py `_MAX_TEMP`, with a
# warning in its log); 0 itself is greedy
ENGINE_MIN_TEMPERATURE = 0.01
REPRODUCED = ("temperature", "top_p", "top_k")  # what the trainer applies to its own logits, in this order


@dataclass(frozen=True, slots=True)
class Sampled:
    """The distribution a call's tokens were drawn from, as the trainer rebuilds it."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k

    @property
    def neutral(self) -> bool:
        return self.temperature == 1.0 and self.top_p >= 1.0 and self.top_k <= 0

    @property
    def truncated(self) -> bool:
        return self.top_p < 1.0 or self.top_k > 0

    def describe(self) -> str | None:
        """The `calls.sampling` text for these settings (None when neutral)."""
        parts = []
        if self.temperature != 1.0:
            parts.append(f"temperature={self.temperature:.6g}")
        if self.top_p < 1.0:
            parts.append(f"top_p={self.top_p:.6g}")
        if self.top_k > 0:
            parts.append(f"top_k={self.top_k}")
        return " ".join(parts) or None


def parse_sampled(text: str | None) -> Sampled | None:
    """The reproducible settings `text` names, or None when it names anything else (something the trainer
    cannot rebuild: a penalty, a grammar, a bias, media)."""
    if not text:
        return Sampled()
    values: dict[str, str] = {}
    for part in text.split(" "):
        name, _, value = part.partition("=")
        if name not in REPRODUCED or not value or name in values:
            return None
        values[name] = value
    try:
        temperature = float(values.get("temperature", 1.0))
        if 0 < temperature < ENGINE_MIN_TEMPERATURE:  # what the engine sampled with, not what was asked
            temperature = ENGINE_MIN_TEMPERATURE
        return Sampled(temperature=temperature, top_p=float(values.get("top_p", 1.0)),
                       top_k=int(values.get("top_k", 0)))
    except ValueError:
        return None
