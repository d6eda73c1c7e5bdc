"""On-policy distillation for a policy with a teacher (core/settings/teacher.py): the teacher's log-probs of the
student's own sampled tokens, and their gap to the student's as each token's advantage (reverse KL on the sampled
token), before the PPO step, which then trains them like any other advantage (importance weight, decoupled ratio).

    transitions = policy_transitions(rollouts, config, version, skips, taught=True, policy=..., ...)
    distiller = Distiller(teacher, settings.distillation, tokenizer, engine=None)   # engine: a URL teacher's
    transitions, report = await distiller.teach(transitions, requests, policy_trainer, skips)

Per sampled token t of a transition the teacher scored:

    gap_t = clip(log p_teacher(t) - log p_student(t), -teacher_clip, teacher_clip)
    A_t   = A_reward_t + teacher_coef * gap_t        (teacher_advantage=added; `only`: teacher_coef * gap_t)

log p_student is the log-prob the engine sampled the token with (the call's recorded one), so the gap is the
per-token reverse KL estimate KL(student || teacher) on the student's own sample, negated; the step record's
`teacher_kl` is its mean over the scored tokens, unclipped. Tokens the student did not sample (context between
merged calls) have no gap. A transition the teacher could not score keeps its reward's advantage (added) or has
none (only), and is counted under the reason; one left with no advantage at all is not trained (zero_advantage).
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any


from core.settings.teacher import Teacher, Teachers
from store.closing import close_idle
from store.dialect import database_now
from trainer.batch import ZERO_ADVANTAGE, build_transitions
from trainer.teacher import Sequence, TeacherEngine
from trainer.teacher_context import teacher_prompt
from trainer.transitions import SkipReasons, Transition

log = logging.getLogger("rlproxy.trainer")

NO_REWARD = "no_reward"  # a rollout closed without a final reward, for a policy without a teacher


def policy_transitions(rollouts: list, config: Any, version: int, skips: SkipReasons, *, taught: bool,
                       policy: str | None = None, **rest: Any) -> list[Transition]:
    """`build_transitions` for one policy: a taught policy also keeps zero-advantage transitions (the teacher
    may give them one) and trains the rollouts closed without a reward, each with reward advantage 0 (built apart,
    so that no rewarded group's baseline counts them); an untaught policy counts those as no_reward."""
    rewarded = [r for r in rollouts if r.reward is not None]
    rewardless = [r for r in rollouts if r.reward is None]
    transitions = build_transitions(rewarded, config, version, skips, keep_zero=taught, policy=policy, **rest)
    if rewardless and taught:
        transitions += build_transitions([replace(r, reward=0.0) for r in rewardless], config, version, skips,
                                         keep_zero=True, policy=policy, **rest)
    elif rewardless:
        for rollout in rewardless:
            answered = [c.id for c in rollout.calls if policy is None or c.policy == policy]
            if answered:
                skips.skip(NO_REWARD, answered)
    return transitions


@dataclass
class TeacherReport:
    """What the teacher did in one step, for the step record (`teacher` in train_steps.metrics) and the log."""
    source: str
    sequences: int = 0  # transitions shown to the teacher
    scored: int = 0  # of them, scored
    tokens: int = 0  # sampled tokens with a gap
    kl: float | None = None  # mean(student logp - teacher logp) over those tokens: the reverse KL, unclipped
    clipped: float = 0.0  # share of those tokens whose gap hit teacher_clip
    gap_mean: float = 0.0  # mean clipped gap (what entered the advantages, before teacher_coef)
    requests: int = 0  # requests sent to a URL teacher, retries included
    seconds: float = 0.0
    skipped: dict[str, int] = field(default_factory=dict)  # transitions without a gap, by reason

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "sequences": self.sequences, "scored": self.scored, "tokens": self.tokens,
                "kl": self.kl, "clipped": self.clipped, "gap_mean": self.gap_mean, "requests": self.requests,
                "seconds": round(self.seconds, 3), "skipped": dict(self.skipped)}

    def describe(self) -> str:
        kl = "n/a" if self.kl is None else f"{self.kl:.4f}"
        missing = ", ".join(f"{n} {r}" for r, n in sorted(self.skipped.items())) or "none"
        return (f"teacher {self.source}: KL {kl} per token over {self.tokens} tokens of {self.scored}/"
                f"{self.sequences} sequences, {100 * self.clipped:.1f}% clipped, unscored: {missing}")


def apply_gaps(transitions: list[Transition], teacher: list[list[float] | None], settings: Teachers,
               report: TeacherReport) -> list[Transition]:
    """Set each transition's per-token advantages from its teacher log-probs (None: not scored); returns those left
    with any advantage. Pure: the core of distillation, tested on exact numbers (tests/test_distill.py)."""
    kept, kl_sum, clipped, gap_sum = [], 0.0, 0, 0.0
    only = settings.teacher_advantage == "only"
    for t, scores in zip(transitions, teacher):
        base = [0.0] * len(t.completion_ids) if only else list(t.advantages())
        if scores is not None:
            if len(scores) != len(t.completion_ids):
                raise ValueError(f"{len(scores)} teacher log-probs for {len(t.completion_ids)} completion tokens")
            report.scored += 1
            for i, (keep, student, theirs) in enumerate(zip(t.mask(), t.behaviour_logprobs, scores)):
                if not keep or not math.isfinite(theirs):
                    continue
                gap = theirs - student
                bounded = max(-settings.teacher_clip, min(settings.teacher_clip, gap))
                kl_sum, gap_sum, report.tokens = kl_sum - gap, gap_sum + bounded, report.tokens + 1
                clipped += bounded != gap
                base[i] += settings.teacher_coef * bounded
        t.token_advantages = base
        if any(a != 0.0 for a, keep in zip(base, t.mask()) if keep):
            kept.append(t)
        else:
            report.skipped[ZERO_ADVANTAGE] = report.skipped.get(ZERO_ADVANTAGE, 0) + 1
    if report.tokens:
        report.kl, report.clipped, report.gap_mean = (kl_sum / report.tokens, clipped / report.tokens,
                                                      gap_sum / report.tokens)
    return kept


class Distiller:
    """One policy's teacher: shows it each transition (its context in the prompt) and turns its log-probs into
    advantages."""

    def __init__(self, teacher: Teacher, settings: Teachers, tokenizer: Any = None,
                 engine: TeacherEngine | None = None) -> None:
        self.teacher, self.settings, self.tokenizer, self.engine = teacher, settings, tokenizer, engine
        self.last: TeacherReport | None = None  # this step's, for its record (attach_reports)

    @property
    def needs_requests(self) -> bool:
        """Whether `teach` needs the calls' recorded requests (to place the context)."""
        return self.teacher.context is not None

    async def teach(self, transitions: list[Transition], requests: dict[str, dict | None], policy: Any,
                    skips: SkipReasons) -> tuple[list[Transition], TeacherReport]:
        """The transitions with the teacher's gap in their advantages (those left with none dropped, counted in
        `skips`), and the report. `requests`: call id -> recorded request (only read with a context); `policy`:
        the PolicyTrainer (a self teacher scores with its adapter disabled)."""
        began = time.perf_counter()
        report = self.last = TeacherReport(source=self.teacher.source, sequences=len(transitions))
        skipped: Counter = Counter()
        prompts: list[list[int] | None] = []
        for t in transitions:
            prompt = teacher_prompt(requests.get(t.call_id), t.prompt_ids, self.tokenizer, self.teacher.context,
                                    self.teacher.context_at)
            if isinstance(prompt, str):
                skipped[prompt] += 1
                prompts.append(None)
            else:
                prompts.append(prompt)
        shown = [i for i, p in enumerate(prompts) if p is not None]
        scores: list[list[float] | None] = [None] * len(transitions)
        if self.engine is not None:
            requests_before = self.engine.requests
            answers = await self.engine.score([Sequence(prompts[i] + transitions[i].completion_ids,
                                                        len(transitions[i].completion_ids)) for i in shown], skipped)
            report.requests = self.engine.requests - requests_before
        else:
            views = [replace(transitions[i], prompt_ids=prompts[i]) for i in shown]
            answers = await asyncio.to_thread(policy.logprobs, views, False) if views else []
        for i, answer in zip(shown, answers):
            scores[i] = answer
        kept = apply_gaps(transitions, scores, self.settings, report)
        report.skipped = {**dict(skipped), **report.skipped}
        left = {id(t) for t in kept}
        trained = {call_id for t in kept for call_id in t.call_ids}
        for t in transitions:
            if id(t) not in left:  # build_transitions had decided on them as trained: this step does not
                skips[ZERO_ADVANTAGE] += 1
                skips.decisions.update({c: ZERO_ADVANTAGE for c in t.call_ids if c and c not in trained})
        report.seconds = time.perf_counter() - began
        return kept, report


async def start_distillers(settings: Any, model_path: Any) -> dict[str, Distiller]:
    """One Distiller per policy with a teacher (`rlproxy train --teacher`); each URL teacher checked (its tokenizer
    and chat template against the model's: TeacherRefused otherwise). {} without a teacher."""
    teachers = settings.distillation.resolve(settings.policies)
    if not teachers:
        return {}
    tokenizer = None  # for a URL teacher's check and for placing a context; a self teacher without one needs none
    if any(not t.is_self or t.context is not None for t in teachers.values()):
        from transformers import AutoTokenizer

        tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, str(model_path))
    key = settings.distillation.api_key()
    upstream_key = settings.upstream_api_key.get_secret_value() if settings.upstream_api_key else None
    distillers = {}
    for policy, teacher in teachers.items():
        engine = None
        if not teacher.is_self:
            own = key or (upstream_key if teacher.source in settings.upstreams else None)
            engine = TeacherEngine(teacher.source, settings.distillation, own, model=teacher.model)
            await engine.check(tokenizer)
        distillers[policy] = Distiller(teacher, settings.distillation, tokenizer, engine)
        log.info("policy %r learns from teacher %s%s", policy, teacher.source,
                 "" if teacher.context is None else f" shown {len(teacher.context)} characters of context "
                                                    f"({teacher.context_at})")
    return distillers


class IdleCloser:
    """Closes, at most every `every_s`, the open rollouts of the taught policies whose agent has been silent for
    teacher_idle_s (store/closing.py): a taught policy trains them without a reward."""

    def __init__(self, sessions: Any, settings: Any, policies: list[str], every_s: float = 10.0) -> None:
        self.sessions, self.idle_s, self.policies, self.every_s = (sessions, settings.distillation.teacher_idle_s,
                                                                    policies, every_s)
        self.last = -math.inf

    async def run_due(self) -> int:
        if not self.policies or time.monotonic() - self.last < self.every_s:
            return 0
        self.last = time.monotonic()
        async with self.sessions() as session, session.begin():
            idle_before = await database_now(session) - timedelta(seconds=self.idle_s)
            closed = await close_idle(session, idle_before, policies=self.policies)
        if closed:
            log.info("closed %d rollouts without a final reward after %.0f s of silence: taught by their teacher",
                     len(closed), self.idle_s)
        return len(closed)


def observe_teacher(metrics: Any, policy: str, report: TeacherReport) -> None:
    """The teacher gap as a gauge per policy and its unscored sequences as a counter (trainer/metrics.py)."""
    if report.kl is not None:
        metrics.teacher_kl.labels(policy).set(report.kl)
    for reason, count in report.skipped.items():
        if reason != ZERO_ADVANTAGE:  # scored, and left with nothing to learn: not the teacher's failing
            metrics.teacher_unscored.labels(policy, reason).inc(count)


def attach_reports(trained: list, distillers: dict[str, Distiller]) -> None:
    """Put each taught policy's teacher report into its step's record: `teacher` (TeacherReport.as_dict) and
    `teacher_kl`, in the record's dict or as the record's fields."""
    for new in trained:
        distiller = distillers.get(new.line.policy)
        if distiller is None or distiller.last is None:
            continue
        report, distiller.last = distiller.last.as_dict(), None
        record = getattr(new, "metrics", None)
        if isinstance(record, dict):
            record.update(teacher=report, teacher_kl=report["kl"])
        else:
            record = new.record
            record.teacher, record.teacher_kl = report, report["kl"]
