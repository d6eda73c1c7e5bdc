"""The tables of what the proxy records: rollouts, the policy calls inside them (and each call's choices), the
rewards given to them, their events, and the tombstones of pruned rollouts."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint, text
from sqlalchemy.orm import Mapped, mapped_column

from core.policy_rules import DEFAULT_POLICY
from store.models.base import Base, Document, FloatArray, IntArray, Timestamp, utcnow


class RolloutStatus:
    OPEN = "open"  # calls may still arrive
    FINISHED = "finished"  # final reward received
    EXPIRED = "expired"  # no final reward within the trainer's reward_ttl_s: never trained, rewards refused


class CallStatus:
    """How a call ended. Only `ok` calls are trained on (store/training.py): every other status means the agent's
    answer was an error or was cut off, so what was recorded is not what the agent was answered."""

    OK = "ok"
    UPSTREAM_ERROR = "upstream_error"  # the engine answered an error, an error event, or ended its stream early
    CLIENT_DISCONNECTED = "client_disconnected"
    TIMEOUT = "timeout"
    STORE_ERROR = "store_error"  # the spool could not keep it: the agent was answered 503 or an error event


class PrefixKind:
    """How a call's prompt relates to the previous call of the same rollout and agent."""

    FIRST = "first"  # no earlier call to extend
    EXTENDS = "extends"  # prompt starts with the parent's prompt + completion ids: mergeable
    RETOKENIZED = "retokenized"  # starts with the parent's prompt, but its completion came back re-tokenized
    DIVERGED = "diverged"  # the history was re-rendered or edited: not even the parent's prompt is a prefix




class RewardKind:
    FINAL = "final"  # the episode outcome; closes the rollout
    CALL = "call"  # an intermediate reward the agent posted for one call
    AIR = "air"  # an automatic intermediate reward derived from what the proxy observed
    # What someone other than the rollout's reward source posted to a sealed rollout (`reward_source`): kept
    # beside the real one, final or for one call (`call_id`), never closing it, never trained on nor counted
    # as evaluation evidence (every reader asks for the kinds above by name). Migration 0015.
    CLAIM = "claim"


class Rollout(Base):
    __tablename__ = "rollouts"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    project: Mapped[str | None] = mapped_column(String(128))
    task_id: Mapped[str | None] = mapped_column(String(256), index=True)
    agent: Mapped[str | None] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16), default=RolloutStatus.OPEN, server_default=RolloutStatus.OPEN)
    reward: Mapped[float | None] = mapped_column(Float)
    metadata_: Mapped[dict[str, Any] | None] = mapped_column("metadata", Document)
    policy_version: Mapped[int | None] = mapped_column(Integer)
    # Evaluation traffic: served like any other, never trained on; final rewards reported per policy version.
    eval: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    call_count: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(Timestamp)
    trained_at: Mapped[datetime | None] = mapped_column(Timestamp)
    train_step_id: Mapped[int | None] = mapped_column(ForeignKey("train_steps.id"))
    lease_owner: Mapped[str | None] = mapped_column(String(128))
    lease_expires_at: Mapped[datetime | None] = mapped_column(Timestamp)
    # steps begun over it that did not finish (several ranks: a failed step stops every rank), and the last
    # failure seen; trainer/worker.py sets a rollout aside after two
    step_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    step_error: Mapped[str | None] = mapped_column(Text)
    # The rollout's two credentials (store/rollout_tokens.py), SHA-256 only: the agent's token, scoped to this
    # rollout, and the grader token of a rollout whose reward source is not its agent. Migration 0015.
    token_hash: Mapped[str | None] = mapped_column(String(64), unique=True, index=True)
    grader_token_hash: Mapped[str | None] = mapped_column(String(64), unique=True, index=True)
    reward_source: Mapped[str | None] = mapped_column(String(16))  # RewardSource; None: the agent (before 0015)
    rewarded_by: Mapped[str | None] = mapped_column(String(16))  # RewardedBy; None: before 0015 or not rewarded

    __table_args__ = (
        # What the trainer asks for: finished, untrained rollouts in finishing order (evaluation rollouts are
        # never trained, so they stay out of it rather than pile up in it).
        Index(
            "ix_rollouts_trainable",
            "finished_at",
            postgresql_where=text("status = 'finished' AND trained_at IS NULL AND NOT eval"),
            sqlite_where=text("status = 'finished' AND trained_at IS NULL AND NOT eval"),
        ),
        # What `GET /policies` reports as evaluation traffic: finished evaluation rollouts by version.
        Index(
            "ix_rollouts_eval",
            "policy_version",
            postgresql_where=text("eval AND status = 'finished'"),
            sqlite_where=text("eval AND status = 'finished'"),
        ),
        # What the trainer's expiry looks for: open rollouts, oldest first (a rollout leaves it once rewarded).
        Index(
            "ix_rollouts_open",
            "created_at",
            postgresql_where=text("status = 'open'"),
            sqlite_where=text("status = 'open'"),
        ),
        # The web view's list in each of its orders, for all projects and for one (store/browse.py ORDERINGS), and
        # a task's newest attempts (migration 0011). The reward order is the expression the list sorts by.
        Index("ix_rollouts_created", "created_at", "id"),
        Index("ix_rollouts_reward", text("coalesce(reward, CAST('-1e+308' AS FLOAT))"), "id"),
        Index("ix_rollouts_project_created", "project", "created_at", "id"),
        Index("ix_rollouts_project_reward", "project", text("coalesce(reward, CAST('-1e+308' AS FLOAT))"), "id"),
        Index("ix_rollouts_task_created", "task_id", "created_at", "id"),
    )


class Call(Base):
    __tablename__ = "calls"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    rollout_id: Mapped[str | None] = mapped_column(ForeignKey("rollouts.id", ondelete="CASCADE"))
    seq: Mapped[int | None] = mapped_column(Integer)
    agent: Mapped[str | None] = mapped_column(String(128))
    task_id: Mapped[str | None] = mapped_column(String(256))
    project: Mapped[str | None] = mapped_column(String(128))
    route: Mapped[str] = mapped_column(String(32))  # "chat" | "completions"
    model: Mapped[str | None] = mapped_column(String(256))  # what the agent asked for
    upstream_model: Mapped[str | None] = mapped_column(String(256))  # what the engine was asked for
    policy_version: Mapped[int | None] = mapped_column(Integer)
    # The named policy that answered (core/policy_rules.py); None for a call to a model outside the policies.
    policy: Mapped[str | None] = mapped_column(String(128), server_default=DEFAULT_POLICY)
    stream: Mapped[bool] = mapped_column(Boolean, default=False)
    status: Mapped[str] = mapped_column(String(32))
    http_status: Mapped[int | None] = mapped_column(Integer)
    upstream: Mapped[str | None] = mapped_column(String(256))
    request: Mapped[dict[str, Any] | None] = mapped_column(Document)
    response: Mapped[dict[str, Any] | None] = mapped_column(Document)
    error: Mapped[str | None] = mapped_column(Text)
    prompt_token_ids: Mapped[list[int] | None] = mapped_column(IntArray)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    prefix_parent_id: Mapped[str | None] = mapped_column(String(64))
    prefix_kind: Mapped[str | None] = mapped_column(String(16))
    latency_ms: Mapped[float | None] = mapped_column(Float)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    # why the recorded raw log-probs are not the behaviour the trainer can compute: what changed the sampled
    # distribution (proxy/capture.py), or `media=<part>` for an image, audio or video in the prompt
    # (proxy/boundary.py); None: nothing
    sampling: Mapped[str | None] = mapped_column(String(64))
    # what its recorded log-probs are (migration 0016): 'processed', the probabilities its tokens were sampled
    # with (after temperature and top-k/top-p), or 'raw', the log-softmax before them; None: recorded before the
    # engines ran processed_logprobs, i.e. raw
    logprobs_mode: Mapped[str | None] = mapped_column(String(16))
    # what `rlproxy serve --rollout-sampling` changed in the agent's request before it went upstream (migration
    # 0017): {"rule", "asked", "sent"}; `request` stays what the agent sent, `sampling` is what the engine got
    sampling_override: Mapped[dict[str, Any] | None] = mapped_column(Document)
    # what the trainer did with it when a step consumed its rollout: 'trained' or the skip reason (the names of
    # a step's `skipped` metrics); None: not decided yet, or trained before migration 0016
    train_decision: Mapped[str | None] = mapped_column(String(64))
    started_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(Timestamp)

    __table_args__ = (
        UniqueConstraint("rollout_id", "seq", name="uq_calls_rollout_seq"),
        Index("ix_calls_rollout_id", "rollout_id"),
        Index("ix_calls_started_at", "started_at"),
    )


class CallChoice(Base):
    """One completion choice of a call (n > 1 gives several): the sampled ids and their logprobs."""

    __tablename__ = "call_choices"

    call_id: Mapped[str] = mapped_column(ForeignKey("calls.id", ondelete="CASCADE"), primary_key=True)
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    token_ids: Mapped[list[int] | None] = mapped_column(IntArray)
    logprobs: Mapped[list[float] | None] = mapped_column(FloatArray)
    finish_reason: Mapped[str | None] = mapped_column(String(32))


class Reward(Base):
    __tablename__ = "rewards"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    rollout_id: Mapped[str] = mapped_column(ForeignKey("rollouts.id", ondelete="CASCADE"), index=True)
    call_id: Mapped[str | None] = mapped_column(ForeignKey("calls.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))
    value: Mapped[float] = mapped_column(Float)
    reason: Mapped[str | None] = mapped_column(String(128))
    metadata_: Mapped[dict[str, Any] | None] = mapped_column("metadata", Document)
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)

    __table_args__ = (
        # At most one automatic reward per call and reason, so replays stay exactly-once.
        Index(
            "uq_rewards_air",
            "call_id",
            "reason",
            unique=True,
            postgresql_where=text("kind = 'air'"),
            sqlite_where=text("kind = 'air'"),
        ),
        # One final reward per rollout from the agent (no reason) and one per other giver (the judge): the
        # database refuses a second even where row locks are no-ops (SQLite). Migration 0006.
        Index(
            "uq_rewards_final",
            "rollout_id",
            unique=True,
            postgresql_where=text("kind = 'final' AND reason IS NULL"),
            sqlite_where=text("kind = 'final' AND reason IS NULL"),
        ),
        Index(
            "uq_rewards_final_by_reason",
            "rollout_id",
            "reason",
            unique=True,
            postgresql_where=text("kind = 'final' AND reason IS NOT NULL"),
            sqlite_where=text("kind = 'final' AND reason IS NOT NULL"),
        ),
    )


class PrunedRollout(Base):
    """A rollout retention deleted (its tombstone): calls of it still waiting in a proxy's spool must not bring it
    back as a new, open rollout numbered from 1 again (store/retention.py writes it, store/calls.py reads it)."""
    __tablename__ = "pruned_rollouts"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    pruned_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)


class RolloutEvent(Base):
    """An agent event other than a reward (`POST /rollouts/{id}/events`), one row each: appending one writes
    only it. Before migration 0008 events were kept in the rollout's metadata under "events"; those are still
    read back (store/events.py) and count towards the rollout's budget."""

    __tablename__ = "rollout_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    rollout_id: Mapped[str] = mapped_column(ForeignKey("rollouts.id", ondelete="CASCADE"))
    event_type: Mapped[str] = mapped_column(String(128))
    data: Mapped[Any] = mapped_column(Document, nullable=True)
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)

    __table_args__ = (Index("ix_rollout_events_rollout_id", "rollout_id", "id"),)
