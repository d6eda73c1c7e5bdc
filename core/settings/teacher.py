"""A teacher per policy (`rlproxy train --teacher`): on-policy distillation, the per-token gap between a teacher's
log-probs and the student's on the student's own sampled tokens taken as advantage (docs/distillation.md).

    --teacher self                        every trained policy: its own base model, adapter off
    --teacher writer=http://host:8000     policy `writer`: an OpenAI-compatible engine with the same tokenizer
    --teacher-context-file examples.txt   shown to the teacher only (a system message, or before the last user turn)

A value `NAME=...` whose NAME is a policy this trainer trains is that policy's; any other value is every policy's
(a policy's own value wins). `resolve` turns the settings into one `Teacher` per policy that has one.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator

from core.settings.base import Part

SELF = "self"
ContextAt = Literal["system", "before_last_user"]
CONTEXT_PLACES = ("system", "before_last_user")


@dataclass(frozen=True, slots=True)
class Teacher:
    """One policy's teacher: `source` is "self" or an engine base URL (no /v1); `context` the text only it sees."""
    policy: str
    source: str
    context: str | None = None
    context_at: str = "system"
    model: str | None = None  # what the engine is asked for; None: the first model its /v1/models lists

    @property
    def is_self(self) -> bool:
        return self.source == SELF


class Teachers(Part):
    teacher: tuple[str, ...] = Field(
        (), description="A teacher for on-policy distillation (docs/distillation.md): `self` (the trainer's own base "
                        "model with the adapter off: no second model) or an OpenAI-compatible engine's base URL "
                        "serving a model with the same tokenizer (checked at start). `NAME=VALUE` gives policy NAME "
                        "its own. A policy with a teacher trains every closed rollout, rewarded or not: the "
                        "advantage of each sampled token gets teacher_coef x (teacher log-prob - student log-prob).",
        json_schema_extra={"split": False, "metavar": "[POLICY=]self|URL"})
    teacher_model: tuple[str, ...] = Field(
        (), description="Model name a URL teacher is asked for ([POLICY=]NAME); default: the first its /v1/models "
                        "lists.", json_schema_extra={"split": False})
    teacher_context: tuple[str, ...] = Field(
        (), description="Text only the teacher sees ([POLICY=]TEXT): worked examples, a hint, the system prompt the "
                        "student should learn to do without; a JSON array of {role, content} messages is inserted as "
                        "those chat turns. The student's prompt is re-rendered with it by the policy's chat "
                        "template; the student's completion ids are never changed, and the agent and the recorded "
                        "calls never see it.", json_schema_extra={"split": False})
    teacher_context_file: tuple[str, ...] = Field(
        (), description="A file whose text is the teacher context ([POLICY=]PATH), read at start.",
        json_schema_extra={"split": False})
    teacher_context_at: tuple[str, ...] = Field(
        (), description="Where the context goes ([POLICY=]system|before_last_user): system puts it first as a "
                        "system message (after an existing system message's text, in that message; chat turns "
                        "right after it), before_last_user as a user message (or the turns) before the prompt's "
                        "last user message. Default system.",
        json_schema_extra={"split": False})
    teacher_coef: float = Field(
        1.0, gt=0, description="Weight of the teacher gap in each token's advantage.")
    teacher_advantage: Literal["added", "only"] = Field(
        "added", description="added: the gap is added to the reward's advantage (0 where no reward came); only: the "
                             "reward's advantage is dropped, the teacher alone teaches.")
    teacher_clip: float = Field(
        5.0, gt=0, description="Bound on each token's gap (nats, both signs) before teacher_coef, so that one token "
                               "the teacher finds very unlikely cannot dominate the step.")
    teacher_idle_s: float = Field(
        600.0, gt=0, description="A rollout whose calls a teacher policy answered and that got no final reward is "
                                 "closed, without reward, once its agent has been silent this long (no call, no "
                                 "reward); then it is trained from the teacher alone.")
    teacher_concurrency: int = Field(
        1, ge=1, description="Requests a URL teacher is sent at once. 1: vLLM 0.32 on CPU with LoRA enabled (every "
                             "rlproxy engine) dies when prompt log-prob requests are batched together (measured: 4 "
                             "at once of 400 tokens; docs/distillation.md); raise it only for a teacher known to "
                             "take them.")
    teacher_step_tokens: int = Field(
        262144, ge=1, description="Most tokens (prompt and completion) a step sends its URL teacher; the sequences "
                                  "past it are trained without the teacher's gap, counted as teacher_budget.")
    teacher_timeout_s: float = Field(120.0, gt=0, description="Seconds one teacher request may take.")
    teacher_attempts: int = Field(
        3, ge=1, description="Tries per teacher request (a timeout, a refused connection, a 5xx); a sequence still "
                             "unscored is trained without the gap, counted as teacher_unscored.")
    teacher_api_key: SecretStr | None = Field(
        None, description="Bearer key sent to a URL teacher; default: upstream_api_key when the teacher is one of "
                          "the upstreams.")

    @field_validator("teacher_context_at")
    @classmethod
    def _places(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        for value in values:
            place = value.rpartition("=")[2]
            if place not in CONTEXT_PLACES:
                raise ValueError(f"teacher_context_at must be one of {', '.join(CONTEXT_PLACES)}, not {place!r}")
        return values

    def resolve(self, policies: tuple[str, ...]) -> dict[str, Teacher]:
        """One Teacher per policy that has one; a context, model or place for a policy without a teacher, or a
        file that cannot be read, is refused (ValueError) rather than ignored."""
        sources = per_policy(self.teacher, policies, "teacher")
        contexts = per_policy(self.teacher_context, policies, "teacher_context")
        files = per_policy(self.teacher_context_file, policies, "teacher_context_file")
        places = per_policy(self.teacher_context_at, policies, "teacher_context_at")
        models = per_policy(self.teacher_model, policies, "teacher_model")
        for name, given in (("teacher_context", contexts), ("teacher_context_file", files),
                            ("teacher_context_at", places), ("teacher_model", models)):
            if stray := sorted(set(given) - set(sources)):
                raise ValueError(f"{name} given for {', '.join(map(repr, stray))}, which has no teacher")
        teachers = {}
        for policy, source in sources.items():
            if policy in contexts and policy in files:
                raise ValueError(f"policy {policy!r}: give teacher_context or teacher_context_file, not both")
            context = contexts.get(policy)
            if policy in files:
                path = Path(files[policy]).expanduser()
                try:
                    context = path.read_text()
                except OSError as exc:
                    raise ValueError(f"teacher_context_file {path}: {exc.strerror or exc}") from None
            if context is not None and not context.strip():
                raise ValueError(f"policy {policy!r}: the teacher context is empty")
            source = source if source == SELF else _engine_base(source)
            if source == SELF and policy in models:
                raise ValueError(f"policy {policy!r}: teacher_model is for a URL teacher, not self")
            teachers[policy] = Teacher(policy, source, context, places.get(policy, "system"), models.get(policy))
        return teachers

    def api_key(self) -> str | None:
        return self.teacher_api_key.get_secret_value() if self.teacher_api_key else None


def per_policy(values: tuple[str, ...], policies: tuple[str, ...], name: str) -> dict[str, str]:
    """`NAME=VALUE` for a trained policy NAME is that policy's, any other value every policy's; a policy's own wins,
    and two values for one policy (or two for every policy) are refused."""
    common: list[str] = []
    own: dict[str, str] = {}
    for value in values:
        head, sep, rest = value.partition("=")
        if sep and head in policies:
            if head in own:
                raise ValueError(f"{name} given twice for policy {head!r}")
            own[head] = rest
        else:
            common.append(value)
    if len(common) > 1:
        raise ValueError(f"{name} given {len(common)} times for every policy: name the policy (POLICY=VALUE)")
    if common:
        return {policy: own.get(policy, common[0]) for policy in policies}
    return own


def _engine_base(url: str) -> str:
    """An engine's base URL without a trailing /v1 (both forms are accepted)."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"a teacher is `self` or an http(s) URL, not {url!r}")
    return url[:-3] if url.endswith("/v1") else url
