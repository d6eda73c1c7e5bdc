"""The tables of what training makes and what is decided about it: each policy version (its adapter), which
replica serves it, the verdicts on it, and the trainer's steps."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, Float, ForeignKey, Index, Integer, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from core.policy_rules import DEFAULT_POLICY
from store.models.base import Base, Document, Timestamp, utcnow


class PolicyStatus:
    CANDIDATE = "candidate"
    ACTIVE = "active"
    RETIRED = "retired"
    FAILED = "failed"
    CANARY = "canary"  # loaded and answering a fraction of new rollouts until judged (store/canary.py)


class Policy(Base):
    """A trained adapter: one version of a named policy. Versions are numbered across all policies (so a
    version number and its adapter name are unique); version 0 is the base model and has no row."""

    __tablename__ = "policies"

    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    name: Mapped[str] = mapped_column(String(128), unique=True)  # the engine's LoRA name
    policy: Mapped[str] = mapped_column(String(128), default=DEFAULT_POLICY, server_default=DEFAULT_POLICY)
    parent_version: Mapped[int | None] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))
    path: Mapped[str | None] = mapped_column(Text)
    base_model: Mapped[str | None] = mapped_column(Text)
    metrics: Mapped[dict[str, Any] | None] = mapped_column(Document)
    # what is not a verdict (the fleet's reference answer, store/replicas.py); verdicts are PolicyVerdict rows
    evaluation: Mapped[dict[str, Any] | None] = mapped_column(Document)
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)
    activated_at: Mapped[datetime | None] = mapped_column(Timestamp)
    # False once the trainer removed its folder (trainer/retention.py): it can no longer be activated
    weights_kept: Mapped[bool] = mapped_column(Boolean, default=True, server_default=text("true"))

    __table_args__ = (
        # One active version per named policy.
        Index(
            "uq_policies_one_active",
            "policy",
            unique=True,
            postgresql_where=text("status = 'active'"),
            sqlite_where=text("status = 'active'"),
        ),
    )


class ReplicaState:
    VERIFIED = "verified"  # loaded and answering as the version's reference: in rotation
    WITHHELD = "withheld"  # could not load or verify it: out of rotation for the version until a retry verifies


class PolicyReplica(Base):
    """Whether one engine replica serves one policy version (engine/fleet.py, store/replicas.py). A replica with
    no row for a version has not been checked for it and is in rotation."""

    __tablename__ = "policy_replicas"

    version: Mapped[int] = mapped_column(ForeignKey("policies.version", ondelete="CASCADE"), primary_key=True)
    replica: Mapped[str] = mapped_column(String(512), primary_key=True)  # the engine's base URL, as configured
    state: Mapped[str] = mapped_column(String(16))
    digest: Mapped[str | None] = mapped_column(String(80))  # of the adapter folder it loaded, where known
    reason: Mapped[str | None] = mapped_column(Text)  # why it is withheld
    failures: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))  # failed tries in a row
    updated_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)


class PolicyVerdict(Base):
    """One measurement or decision about a policy version (store/verdicts.py): a canary's start and its end, a
    command gate's score (and verdict), an `rlproxy eval` score. Rows are only added, never changed, so writers
    from several processes never read-modify-write; the newest row of a kind (and split) is the current one."""

    __tablename__ = "policy_verdicts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    version: Mapped[int] = mapped_column(ForeignKey("policies.version", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(32))  # canary, command_gate, command_eval, heldout
    split: Mapped[str | None] = mapped_column(String(32))  # the evaluation command's split, where it has one
    measured: Mapped[str | None] = mapped_column(String(80))  # a digest of what was measured (command and split, tasks)
    score: Mapped[float | None] = mapped_column(Float)
    parent_version: Mapped[int | None] = mapped_column(Integer)  # what it was compared with (0: the base model)
    parent_score: Mapped[float | None] = mapped_column(Float)
    promoted: Mapped[bool | None] = mapped_column(Boolean)  # None: no decision (a canary running, a score alone)
    evidence: Mapped[dict[str, Any] | None] = mapped_column(Document)  # the rest, as each kind records it
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)

    __table_args__ = (
        Index("ix_policy_verdicts_version_kind", "version", "kind"),
        Index("ix_policy_verdicts_parent_version", "parent_version"),
    )


class TrainStep(Base):
    __tablename__ = "train_steps"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    policy_version: Mapped[int | None] = mapped_column(Integer)
    rollout_count: Mapped[int] = mapped_column(Integer)
    transition_count: Mapped[int] = mapped_column(Integer)
    metrics: Mapped[dict[str, Any] | None] = mapped_column(Document)
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)
