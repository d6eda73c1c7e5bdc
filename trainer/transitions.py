"""Turn a rollout's recorded LLM calls into training transitions, and pack them into micro-batches.

A transition is a token sequence `prompt_ids + completion_ids` with one behaviour log-prob per
completion token and a mask saying which completion tokens the model sampled. Multi-turn calls whose
prompt starts with the previous call's exact prompt + completion are merged into one sequence: the
model-sampled spans are trained, the tokens added in between (tool results, user turns, template
tokens) are context only (mask 0). That trains the whole conversation in one forward pass instead of
re-reading the shared prefix once per call.
"""
from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Transition:
    prompt_ids: list[int]
    completion_ids: list[int]
    behaviour_logprobs: list[float]  # one per completion token (placeholder 0.0 where loss_mask is 0)
    advantage: float
    loss_mask: list[int] | None = None  # per completion token; None = all sampled by the model
    token_advantages: list[float] | None = None  # per completion token; set when merged calls differ
    call_ids: list[str] = field(default_factory=list)
    rollout_id: str | None = None
    policy_version: int | None = None  # oldest policy that sampled any of its tokens
    # the distribution its tokens were drawn from (core.sampling_rules.Sampled: temperature, top-p, top-k);
    # None: temperature 1, the whole vocabulary. One per transition: calls sampled otherwise are not merged.
    sampled: Any = None

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    @property
    def call_id(self) -> str | None:
        return self.call_ids[0] if self.call_ids else None

    def mask(self) -> list[int]:
        return self.loss_mask if self.loss_mask is not None else [1] * len(self.completion_ids)

    def advantages(self) -> list[float]:
        if self.token_advantages is not None:
            return self.token_advantages
        return [float(self.advantage)] * len(self.completion_ids)

    def num_trained_tokens(self) -> int:
        return sum(self.mask())


@dataclass
class Call:
    """One recorded LLM call as `merge_trajectory` reads it (any object or mapping with these names works)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    advantage: float = 0.0
    extends_previous: bool = False
    call_id: str | None = None
    rollout_id: str | None = None
    policy_version: int | None = None
    sampled: Any = None  # as Transition.sampled


class SkipReasons(Counter):
    """Counts why calls were not trained on (reason -> calls), and keeps the reason each named call got
    (`decisions`, call id -> reason: stored as `calls.train_decision`). The first reason a call gets is its own:
    a call counted twice (one choice dropped, another trained) keeps the earlier."""

    def __init__(self, *args: Any, **counts: int) -> None:
        super().__init__(*args, **counts)
        self.decisions: dict[str, str] = {}

    def skip(self, reason: str, call_ids: Iterable[str | None] = ()) -> None:
        """Count one skip under `reason` and note it for each of `call_ids` not decided yet."""
        self[reason] += 1
        for call_id in call_ids:
            if call_id is not None:
                self.decisions.setdefault(str(call_id), reason)

    NO_TOKEN_IDS = "no_token_ids"
    EMPTY_COMPLETION = "empty_completion"
    LOGPROB_COUNT = "logprob_count_mismatch"
    NONFINITE_LOGPROB = "nonfinite_logprob"
    TOO_LONG = "too_long"


def _get(call: Any, name: str, default: Any = None) -> Any:
    if isinstance(call, Mapping):
        return call.get(name, default)
    return getattr(call, name, default)


def _all_finite(values: Sequence[Any]) -> bool:
    """Every value a finite number: a NaN logit reaches the stream as `"logprob": null`, stored as None."""
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)


def _all_token_ids(values: Sequence[Any]) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values)


def _skip_reason(call: Any, max_seq_len: int) -> str | None:
    prompt, completion, logprobs = (_get(call, k) for k in ("prompt_ids", "completion_ids", "logprobs"))
    if not prompt or completion is None or logprobs is None:
        return SkipReasons.NO_TOKEN_IDS
    if len(completion) == 0:
        return SkipReasons.EMPTY_COMPLETION
    if len(logprobs) != len(completion):
        return SkipReasons.LOGPROB_COUNT
    if not _all_token_ids(prompt) or not _all_token_ids(completion):
        return SkipReasons.NO_TOKEN_IDS
    if not _all_finite(logprobs):
        return SkipReasons.NONFINITE_LOGPROB
    if _too_long(len(prompt) + len(completion), max_seq_len):
        return SkipReasons.TOO_LONG
    return None


def _too_long(length: int, max_seq_len: int) -> bool:
    """Over the bound; 0 is none (max_seq_len 0 before the worker read the engines' max_model_len: the
    transitions a rank is handed, an export)."""
    return 0 < max_seq_len < length


class _Chain:
    """A transition under construction: one call, then the calls that extend it."""

    def __init__(self, call: Any) -> None:
        self.prompt = list(_get(call, "prompt_ids"))
        self.completion: list[int] = []
        self.logprobs: list[float] = []
        self.mask: list[int] = []
        self.advantages: list[float] = []
        self.call_ids: list[str] = []
        self.versions: list[int] = []
        self.rollout_id = _get(call, "rollout_id")
        self.sampled = _neutral_as_none(_get(call, "sampled"))
        self._add_generated(call)

    def __len__(self) -> int:
        return len(self.prompt) + len(self.completion)

    def extended_by(self, call: Any) -> bool:
        """True when `call`'s prompt starts with this chain's exact token sequence and it was sampled alike (one
        transition is scored at one temperature and truncation)."""
        if _neutral_as_none(_get(call, "sampled")) != self.sampled:
            return False
        return list(_get(call, "prompt_ids")[: len(self)]) == self.prompt + self.completion

    def extend(self, call: Any) -> None:
        context = list(_get(call, "prompt_ids"))[len(self):]  # tokens the model did not sample
        self.completion += context
        self.logprobs += [0.0] * len(context)
        self.mask += [0] * len(context)
        self.advantages += [0.0] * len(context)
        self._add_generated(call)

    def _add_generated(self, call: Any) -> None:
        completion = list(_get(call, "completion_ids"))
        advantage = float(_get(call, "advantage", 0.0) or 0.0)
        self.completion += completion
        self.logprobs += [float(x) for x in _get(call, "logprobs")]
        self.mask += [1] * len(completion)
        self.advantages += [advantage] * len(completion)
        if _get(call, "call_id") is not None:
            self.call_ids.append(str(_get(call, "call_id")))
        if _get(call, "policy_version") is not None:
            self.versions.append(int(_get(call, "policy_version")))

    def to_transition(self) -> Transition:
        trained = {a for a, m in zip(self.advantages, self.mask) if m}
        merged = 0 in self.mask
        return Transition(
            prompt_ids=self.prompt,
            completion_ids=self.completion,
            behaviour_logprobs=self.logprobs,
            advantage=next(iter(trained)) if len(trained) == 1 else 0.0,
            loss_mask=self.mask if merged else None,
            token_advantages=self.advantages if len(trained) > 1 else None,
            call_ids=self.call_ids,
            rollout_id=self.rollout_id,
            policy_version=min(self.versions) if self.versions else None,
            sampled=self.sampled,
        )


def _neutral_as_none(sampled: Any) -> Any:
    return None if sampled is None or getattr(sampled, "neutral", False) else sampled


def merge_trajectory(
    calls: Iterable[Any], *, max_seq_len: int, skips: SkipReasons | None = None
) -> list[Transition]:
    """Merge a rollout's ordered calls into transitions.

    A call with `extends_previous` whose prompt really starts with the previous (valid) call's whole
    sequence is appended to it; anything else (including a flag whose prefix does not match, e.g. after
    re-tokenisation) starts a new transition. Invalid calls are dropped and counted in `skips`; they
    break the chain, and the next call starts afresh from its own (complete) prompt.
    """
    skips = skips if skips is not None else SkipReasons()
    transitions: list[Transition] = []
    chain: _Chain | None = None
    for call in calls:
        reason = _skip_reason(call, max_seq_len)
        if reason is not None:
            skips.skip(reason, [_get(call, "call_id")])
            if chain is not None:
                transitions.append(chain.to_transition())
                chain = None
            continue
        # A merged sequence is as long as its last call's prompt + completion, already checked above.
        if chain is not None and _get(call, "extends_previous", False) and chain.extended_by(call):
            chain.extend(call)
            continue
        if chain is not None:
            transitions.append(chain.to_transition())
        chain = _Chain(call)
    if chain is not None:
        transitions.append(chain.to_transition())
    return transitions


def validate_transition(t: Transition, max_seq_len: int) -> str | None:
    """The skip reason for a ready-made transition, or None when it can be trained on."""
    if not t.prompt_ids:
        return SkipReasons.NO_TOKEN_IDS
    if not t.completion_ids:
        return SkipReasons.EMPTY_COMPLETION
    n = len(t.completion_ids)
    if len(t.behaviour_logprobs) != n or (t.loss_mask is not None and len(t.loss_mask) != n):
        return SkipReasons.LOGPROB_COUNT
    if t.token_advantages is not None and len(t.token_advantages) != n:
        return SkipReasons.LOGPROB_COUNT
    if not _all_token_ids(t.prompt_ids) or not _all_token_ids(t.completion_ids):
        return SkipReasons.NO_TOKEN_IDS
    if not _all_finite(t.behaviour_logprobs):
        return SkipReasons.NONFINITE_LOGPROB
    if _too_long(len(t), max_seq_len):
        return SkipReasons.TOO_LONG
    if t.num_trained_tokens() == 0:
        return SkipReasons.EMPTY_COMPLETION
    return None


def split_by_tokens(transitions: Sequence[Transition], parts: int) -> list[list[Transition]]:
    """`parts` shares (one per rank) of near-equal token counts: longest first, each to the share with the fewest
    tokens so far (the lower rank on a tie). A rank's step time goes with its tokens, not its transitions: dealt by
    count, one rank could draw an agent's long merged conversations and the others short calls, and every rank
    waits for it at each gathered layer."""
    shares: list[list[Transition]] = [[] for _ in range(parts)]
    loads = [(0, rank) for rank in range(parts)]  # a heap of (tokens, rank)
    for t in sorted(transitions, key=len, reverse=True):  # stable: ties keep input order
        tokens, rank = heapq.heappop(loads)
        shares[rank].append(t)
        heapq.heappush(loads, (tokens + len(t), rank))
    return shares


def pack_micro_batches(transitions: Sequence[Transition], token_budget: int) -> list[list[Transition]]:
    """Group transitions so each group's padded size (rows x longest row) stays within `token_budget`.

    Longest first, so rows of a group have similar lengths and padding stays small. A transition
    longer than the budget gets a group of its own.
    """
    ordered = sorted(transitions, key=len, reverse=True)  # stable: ties keep input order
    batches: list[list[Transition]] = []
    current: list[Transition] = []
    for t in ordered:
        longest = len(current[0]) if current else len(t)  # descending order: the first row is the longest
        if current and (len(current) + 1) * longest > token_budget:
            batches.append(current)
            current = []
        current.append(t)
    if current:
        batches.append(current)
    return batches
