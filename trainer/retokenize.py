"""The ablation of exact capture: train on the conversation text re-tokenized, as a pipeline that logs only
text must, instead of on the token ids the engine sampled (`TrainingSettings.token_source = "retokenized"`).

A text-only pipeline has two handicaps, and both are reproduced here:
  * its token ids are the tokenizer's reading of the text, which need not be the sequence the model
    produced (a sampled word split differently, a chat template that renders history differently);
  * it has no sampling log-probs for those ids, so the behaviour policy's log-probs are recomputed by the
    trainer's current model (`PolicyTrainer.logprobs`), which hides any drift between the policy that
    sampled and the one that trains (staleness, engine vs trainer numerics) from the PPO ratio.

Only bench/learning.py's ablation uses this; the default, "recorded", never re-tokenizes.
"""
from __future__ import annotations

from typing import Any

from store.models import PrefixKind
from store.training import RolloutData


def retokenize(rollouts: list[RolloutData], texts: dict[str, tuple[dict | None, dict | None]], tokenizer: Any) -> int:
    """Replace each call's recorded ids with the tokenizer's ids for its recorded text, in place.

    `texts` maps call id -> (request, response) as the proxy stored them. Log-probs become placeholders
    (zeros) to be recomputed; prefix links are re-derived from the new ids. Calls without text (redacted)
    lose their ids and are skipped by the trainer. Returns how many sequences came out different from the
    recorded ones.
    """
    changed = 0
    for rollout in rollouts:
        previous: list[int] | None = None
        for call in rollout.calls:
            request, response = texts.get(call.id, (None, None))
            messages = (request or {}).get("messages")
            if not messages or not response:
                call.prompt_ids, call.choices, previous = None, [], None
                continue
            prompt = list(tokenizer.apply_chat_template(messages, tools=request.get("tools"),
                                                        add_generation_prompt=True, tokenize=True,
                                                        return_dict=False))
            choices = []
            for index, choice in enumerate(response.get("choices", [])):
                ids = completion_ids(choice, tokenizer)
                recorded = call.choices[index][0] if index < len(call.choices) else None
                changed += ids != recorded
                choices.append((ids, [0.0] * len(ids)))
            changed += prompt != call.prompt_ids
            link = previous is not None and prompt[: len(previous)] == previous
            call.prompt_ids, call.choices = prompt, choices
            call.prefix_kind = PrefixKind.EXTENDS if link else PrefixKind.FIRST
            previous = prompt + choices[0][0] if len(choices) == 1 else None
    return changed


def completion_ids(choice: dict, tokenizer: Any) -> list[int]:
    """The tokenizer's ids for a choice's text, with the end-of-turn token when the model stopped by itself."""
    message = choice.get("message") or {}
    text = message.get("content") or ""
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    if choice.get("finish_reason") == "stop" and tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return ids
