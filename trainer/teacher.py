"""A URL teacher: an OpenAI-compatible engine (vLLM) that scores the student's exact token ids by prompt log-probs.

    engine = TeacherEngine(url, settings.distillation, api_key, model=None)
    await engine.check(tokenizer)                  # same tokenizer, or TeacherRefused with what differs
    scores = await engine.score(sequences)         # per sequence: log-probs of its last `scored` ids, or None

One request per sequence, `POST /v1/completions` with the token ids as the prompt, `max_tokens` 1 and
`prompt_logprobs` 0: vLLM answers `choices[0].prompt_logprobs`, per prompt position a mapping from token id to
{logprob, rank, decoded_token} that always holds the prompt's own token (the first position is null), at
temperature 1 whatever the request's temperature (measured on vLLM 0.32, docs/distillation.md). Requests are bounded
per step (`teacher_concurrency` at once, `teacher_step_tokens` in all), each under `teacher_timeout_s`, retried
`teacher_attempts` times on a timeout, a refused connection or a 5xx (tenacity); a sequence still unscored gets
None and the step goes on without its gap, counted under the reason.

The check at start compares what the engine's `/tokenize` makes of a probe text and of a chat (its template)
with the trainer's tokenizer: a teacher with another vocabulary would score other tokens than the student sampled.
"""
from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any

import aiohttp
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from core.errors import RlproxyError
from core.settings.teacher import Teachers

log = logging.getLogger("rlproxy.trainer")

# Digits, spaces, punctuation, non-Latin text and an emoji: where vocabularies of different families split apart.
PROBE = "Teacher check: 17*23 = 391, naïve café — 東京 🙂\n\tdef f(x): return x**2"
PROBE_CHAT = [{"role": "system", "content": "You check tokenizers."}, {"role": "user", "content": PROBE}]

UNSCORED = "teacher_unscored"  # the teacher did not answer within its attempts, or answered something unusable
BUDGET = "teacher_budget"  # past the step's token budget for the teacher
TOO_LONG = "teacher_too_long"  # the teacher's prompt (with its context) is longer than the teacher's context


class TeacherRefused(RlproxyError, ValueError):
    """The teacher cannot teach this policy: another tokenizer, no way to check it, no model."""


class _Retry(RlproxyError):
    """A teacher request worth trying again (timeout, connection, 5xx)."""


@dataclass(frozen=True, slots=True)
class Sequence:
    """What the teacher scores: `ids` (its prompt, then the student's completion ids) and how many of the last ids
    are the completion (their log-probs are what comes back)."""
    ids: list[int]
    scored: int


class TeacherEngine:
    def __init__(self, base_url: str, settings: Teachers, api_key: str | None = None, model: str | None = None,
                 max_model_len: int | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.settings = settings
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.model = model
        self.max_model_len = max_model_len
        self.requests = 0  # sent, attempts included: what the step record reports

    def _session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(headers=self.headers,
                                     timeout=aiohttp.ClientTimeout(total=self.settings.teacher_timeout_s))

    async def check(self, tokenizer: Any) -> None:
        """Refuse (TeacherRefused) a teacher whose tokenizer is not the trainer's; learn its model and context."""
        async with self._session() as client:
            listed = await self._get(client, "/v1/models")
            models = [m for m in (listed or {}).get("data", []) if isinstance(m, dict) and m.get("id")]
            if not models:
                raise TeacherRefused(f"the teacher {self.base_url} lists no model at /v1/models")
            chosen = next((m for m in models if m["id"] == self.model), None) if self.model else models[0]
            if chosen is None:
                raise TeacherRefused(f"the teacher {self.base_url} does not serve {self.model!r} (it serves "
                                     f"{', '.join(m['id'] for m in models)})")
            self.model, self.max_model_len = chosen["id"], chosen.get("max_model_len") or self.max_model_len
            mine = list(tokenizer(PROBE, add_special_tokens=True)["input_ids"])
            theirs = await self._tokens(client, {"prompt": PROBE, "add_special_tokens": True})
            if theirs != mine:
                raise TeacherRefused(_differ(self.base_url, self.model, "a probe text", mine, theirs))
            mine = list(tokenizer.apply_chat_template(PROBE_CHAT, add_generation_prompt=True, tokenize=True,
                                                      return_dict=False))
            theirs = await self._tokens(client, {"messages": PROBE_CHAT, "add_generation_prompt": True})
            if theirs != mine:
                raise TeacherRefused(_differ(self.base_url, self.model, "a chat (its chat template)", mine, theirs))
        log.info("teacher %s (%s): same tokenizer and chat template as the trainer's", self.base_url, self.model)

    async def _tokens(self, client: aiohttp.ClientSession, body: dict) -> list[int]:
        try:
            async with client.post(f"{self.base_url}/tokenize", json={"model": self.model, **body}) as answer:
                if answer.status != 200:
                    raise TeacherRefused(f"the teacher {self.base_url} answered {answer.status} to /tokenize, so its "
                                         "tokenizer cannot be checked against the trainer's: a teacher must be an "
                                         "engine with /tokenize (vLLM) serving a model with the same tokenizer")
                tokens = (await answer.json()).get("tokens")
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise TeacherRefused(f"the teacher {self.base_url} cannot be reached ({exc!r})") from None
        return [int(t) for t in tokens or []]

    async def _get(self, client: aiohttp.ClientSession, path: str) -> Any:
        try:
            async with client.get(f"{self.base_url}{path}") as answer:
                if answer.status != 200:
                    raise TeacherRefused(f"the teacher {self.base_url} answered {answer.status} to {path}")
                return await answer.json()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise TeacherRefused(f"the teacher {self.base_url} cannot be reached ({exc!r})") from None

    async def score(self, sequences: list[Sequence], skipped: Counter | None = None) -> list[list[float] | None]:
        """Per sequence the teacher's log-probs of its last `scored` ids, or None (why: counted in `skipped`)."""
        skipped = skipped if skipped is not None else Counter()
        results: list[list[float] | None] = [None] * len(sequences)
        budget = self.settings.teacher_step_tokens
        gate = asyncio.Semaphore(self.settings.teacher_concurrency)
        wanted = []
        for index, sequence in enumerate(sequences):
            if self.max_model_len and len(sequence.ids) + 1 > self.max_model_len:
                skipped[TOO_LONG] += 1
            elif len(sequence.ids) > budget:
                skipped[BUDGET] += 1
            else:
                budget -= len(sequence.ids)
                wanted.append(index)

        async def one(client: aiohttp.ClientSession, index: int) -> None:
            async with gate:
                try:
                    results[index] = await self._score_one(client, sequences[index])
                except (_Retry, ValueError, KeyError, TypeError, aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    log.warning("the teacher could not score a sequence of %d tokens: %s", len(sequences[index].ids),
                                exc)
                    skipped[UNSCORED] += 1

        async with self._session() as client:
            await asyncio.gather(*(one(client, index) for index in wanted))
        return results

    async def _score_one(self, client: aiohttp.ClientSession, sequence: Sequence) -> list[float]:
        body = {"model": self.model, "prompt": sequence.ids, "max_tokens": 1, "temperature": 1.0,
                "prompt_logprobs": 0}
        async for attempt in AsyncRetrying(stop=stop_after_attempt(self.settings.teacher_attempts),
                                           wait=wait_exponential(multiplier=0.5, max=8),
                                           retry=retry_if_exception_type(_Retry), reraise=True):
            with attempt:
                self.requests += 1
                try:
                    async with client.post(f"{self.base_url}/v1/completions", json=body) as answer:
                        if answer.status >= 500 or answer.status == 429:
                            raise _Retry(f"{answer.status} from the teacher")
                        if answer.status != 200:
                            raise ValueError(f"{answer.status} from the teacher: {(await answer.text())[:200]}")
                        reply = await answer.json()
                except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
                    raise _Retry(repr(exc)) from exc
        return prompt_logprobs(reply, sequence)


def prompt_logprobs(reply: dict, sequence: Sequence) -> list[float]:
    """The log-probs of `sequence`'s last `scored` ids from a vLLM completion's `prompt_logprobs` (ValueError when
    the reply does not hold one for each of those ids)."""
    positions = reply["choices"][0]["prompt_logprobs"]
    if not isinstance(positions, list) or len(positions) != len(sequence.ids):
        raise ValueError(f"prompt_logprobs for {len(positions or [])} positions, not {len(sequence.ids)}")
    start = len(sequence.ids) - sequence.scored
    scores = []
    for token, entry in zip(sequence.ids[start:], positions[start:]):
        found = (entry or {}).get(str(token))
        if found is None:
            raise ValueError(f"prompt_logprobs hold no log-prob for token {token}")
        scores.append(float(found["logprob"] if isinstance(found, dict) else found))
    return scores


def _differ(url: str, model: str, what: str, mine: list[int], theirs: list[int]) -> str:
    at = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
    return (f"the teacher {url} ({model}) tokenizes {what} otherwise than the trainer's model: from token {at} it "
            f"gives {theirs[at:at + 6]} where the trainer has {mine[at:at + 6]} ({len(theirs)} against {len(mine)} "
            "tokens). Distillation scores the student's own token ids, so the teacher must use the same tokenizer "
            "and chat template: serve a model of the same family, or use --teacher self")
