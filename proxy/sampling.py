"""How each call was sampled, as far as its recorded log-probs depend on it (`calls.sampling`, core/sampling_rules.py).

The engines run with `--logprobs-mode processed_logprobs` (engine/command.py): a call's log-probs are those its
tokens were sampled with, after temperature and top-k/top-p (docs/vllm-wire-format.md section 12). The trainer
rebuilds that distribution from its own logits (trainer/logprobs.py), so a call sampled at temperature 0.7 with
top_p 0.95 is recorded as `temperature=0.7 top_p=0.95` and trained as it was sampled. What the trainer cannot
rebuild (penalties, logit bias, a grammar, a forced tool, a thinking budget, min_p) is named by its first field,
and the trainer skips such a call under its own reason (trainer/sampled.py).

Read from the body sent upstream (every wire format translated to the engine's), with absent fields at vLLM's
defaults: the engine is started with `--generation-config vllm`, so a model's own generation_config.json (Qwen3:
temperature 0.6, top_p 0.95, top_k 20) does not silently change what an absent field means.
"""
from __future__ import annotations

from typing import Any

from core.sampling_rules import Sampled

# field -> the values that leave the distribution as the raw log-probs describe it
_NEUTRAL: dict[str, Any] = {
    "min_p": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "min_tokens": (0,),  # the end-of-sequence token is masked until then
    "ignore_eos": (False,),
}
# present and not empty: each masks or shifts some tokens' probabilities
_CONSTRAINTS = ("logit_bias", "allowed_token_ids", "bad_words", "structured_outputs")


def altered_sampling(upstream_body: dict[str, Any]) -> str | None:
    """How the call's distribution differs from vLLM's neutral one: the first field the trainer cannot rebuild
    (as `name=value` or `name`), else the temperature, top_p and top_k it can (`temperature=0.7 top_p=0.95`),
    else None (sampled at temperature 1 from the whole vocabulary)."""
    for name, neutral in _NEUTRAL.items():
        value = upstream_body.get(name)
        if value is not None and value not in neutral:
            return f"{name}={value}"
    for name in _CONSTRAINTS:
        if upstream_body.get(name):
            return name
    budget = upstream_body.get("thinking_token_budget")
    if budget is not None:  # once spent, the sampler forces the end-of-thinking tokens, whatever their log-probs
        return f"thinking_token_budget={budget}"
    response_format = upstream_body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") not in (None, "text"):
        return f"response_format={response_format.get('type')}"
    best_of, n = upstream_body.get("best_of"), upstream_body.get("n") or 1
    if isinstance(best_of, int) and best_of > n:  # the returned completions were picked from more
        return f"best_of={best_of}"
    tool_choice = upstream_body.get("tool_choice")
    if tool_choice == "required" or isinstance(tool_choice, dict):  # vLLM forces these with a grammar
        return "tool_choice=required" if tool_choice == "required" else "tool_choice=named"
    return _reproducible(upstream_body)


def _reproducible(body: dict[str, Any]) -> str | None:
    """`temperature=... top_p=... top_k=...` for the settings that are not neutral (a value the engine will refuse
    is named as it came: the call fails there and is never trained)."""
    temperature, top_p, top_k = body.get("temperature"), body.get("top_p"), body.get("top_k")
    try:
        sampled = Sampled(temperature=1.0 if temperature is None else float(temperature),
                          top_p=1.0 if top_p is None else float(top_p),
                          top_k=0 if top_k is None or top_k == -1 else int(top_k))
    except (TypeError, ValueError):
        return f"temperature={temperature}"[:64]
    return sampled.describe()
