"""Which recorded calls the trainer can score as they were sampled, and with what.

A call's behaviour log-probs are those the engine recorded. The trainer scores its tokens from its own logits at
the call's temperature with its top-k/top-p applied (trainer/logprobs.py), so the two agree at lag 0 when the
engine recorded the same distribution: with `--logprobs-mode processed_logprobs` (calls.logprobs_mode
'processed'). With raw log-probs (the engine's default, and every call recorded before the column: None) only a
neutral call's log-probs are its behaviour.
"""
from __future__ import annotations

from core.sampling_rules import PROCESSED, Sampled, parse_sampled

SAMPLING_ALTERED = "sampling_altered"  # sampled otherwise than its log-probs say, or than the trainer can rebuild
MEDIA_IN_PROMPT = "media_in_prompt"  # an image, audio, video: the trainer sees only its placeholder ids
GREEDY = "greedy_sampling"  # temperature 0: no token was drawn at its probability, and every attempt is the same


def sampled_with(call) -> Sampled | None:
    """The distribution the call's tokens were drawn from as the trainer rebuilds it, or None when it cannot."""
    sampled = parse_sampled(call.sampling)
    if sampled is None or sampled.temperature <= 0:
        return None
    if not sampled.neutral and getattr(call, "logprobs_mode", None) != PROCESSED:
        return None  # raw log-probs of a tempered or truncated call are not its behaviour
    return sampled


def unreproducible(call) -> str | None:
    """Why the call cannot be trained as sampled (a step's skip reason), or None when it can."""
    sampling = call.sampling
    if sampling is not None and sampling.startswith("media="):  # proxy/boundary.py
        return MEDIA_IN_PROMPT
    sampled = parse_sampled(sampling)
    if sampled is not None and sampled.temperature <= 0:
        return GREEDY
    return SAMPLING_ALTERED if sampled_with(call) is None else None
