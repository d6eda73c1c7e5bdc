"""Whether the log-probs the engine returns for a call are the probabilities its tokens were sampled with.

vLLM returns raw log-probs (`--logprobs-mode raw_logprobs`, its default and the engine's here): the log-softmax
of the logits before temperature, top-p/top-k/min-p, penalties, logit bias, grammar masks and the thinking budget
(docs/vllm-wire-format.md section 12). They are the sampling probabilities only when none of those changed
the distribution. Trained as behaviour log-probs otherwise, the importance weight would be computed against a
distribution the tokens were not drawn from: a call sampled at temperature 0.7 is sharper than its recorded
log-probs say, and nothing would correct for it. Such a call is recorded as it is and marked with the first
field that changed its sampling; the trainer skips it under its own reason (trainer/batch.py).

Read from the body sent upstream (every wire format translated to the engine's), with absent fields at vLLM's
defaults: the engine is started with `--generation-config vllm`, so a model's own generation_config.json (Qwen3:
temperature 0.6, top_p 0.95, top_k 20) does not silently change what an absent field means.
"""
from __future__ import annotations

from typing import Any

# field -> the values that leave the distribution as the raw log-probs describe it
_NEUTRAL: dict[str, Any] = {
    "temperature": (1, 1.0),
    "top_p": (1, 1.0),
    "top_k": (0, -1),
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
    """The first field that made the sampled distribution differ from the raw log-probs (as `name=value`), or
    None when the recorded log-probs are the sampling probabilities."""
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
    return None
