"""The schema: rollouts, the policy calls inside them, rewards, and the policies (adapters) trained from them.

One module per family of tables: what the proxy records (recorded.py), what training makes and what is decided
about it (policies.py), who may call (tenancy.py), all on one declarative base (base.py). Token ids and logprobs
are typed arrays on Postgres (INTEGER[] / REAL[]) and JSON lists on SQLite. The schema changes only through
Alembic (`migrations/`); these models are what migrations are written from.

This package is the schema's one door: the rest imports the tables from here, and importing it registers every
table on `Base.metadata` (what `create_all` and Alembic read)."""
from __future__ import annotations

from store.models.base import NAMING, Base, Document, FloatArray, IntArray, Timestamp, as_utc, utcnow
from store.models.policies import Policy, PolicyReplica, PolicyStatus, PolicyVerdict, ReplicaState, TrainStep
from store.models.recorded import (
    Call,
    CallChoice,
    CallStatus,
    PrefixKind,
    PrunedRollout,
    Reward,
    RewardKind,
    Rollout,
    RolloutEvent,
    RolloutStatus,
)
from store.models.tenancy import ApiKey, Project

__all__ = ["NAMING", "ApiKey", "Base", "Call", "CallChoice", "CallStatus", "Document", "FloatArray", "IntArray",
           "Policy", "PolicyReplica", "PolicyStatus", "PolicyVerdict", "PrefixKind", "Project", "PrunedRollout",
           "ReplicaState", "Reward", "RewardKind", "Rollout", "RolloutEvent", "RolloutStatus", "Timestamp",
           "TrainStep", "as_utc", "utcnow"]
