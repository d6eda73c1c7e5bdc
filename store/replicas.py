"""Which engine replicas serve a policy version: the store's side of engine/fleet.py.

Two facts, both read by every proxy on its policy refresh:

* per version, what each replica must serve (`FleetRecord`): the digest of the adapter folder's files and the
  reference answer to the probe request, kept in the policy row's `evaluation` JSON under "fleet". Written
  when the version is first committed to the fleet, before it serves.
* per (version, replica), whether that replica serves it: `verified`, or `withheld` with the reason (table
  `policy_replicas`). A replica without a row for a version is in rotation for it (versions committed before
  this record existed have none).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from store import policies
from store.dialect import upsert
from store.models import PolicyReplica, ReplicaState, utcnow

KEY = "fleet"  # where a version's FleetRecord lives in its policy row's evaluation JSON
VERIFIED, WITHHELD = ReplicaState.VERIFIED, ReplicaState.WITHHELD


@dataclass(slots=True, frozen=True)
class Probe:
    """One replica's answer to the probe request: its top token and that token's logprob."""
    token: str
    logprob: float


@dataclass(slots=True, frozen=True)
class FleetRecord:
    """What every replica serving a version must match: `digest` of its folder ("sha256:…"; None where the
    process that committed it could not read the folder) and `probe`, the reference answer (None: not probed)."""
    digest: str | None
    probe: Probe | None
    prompt: str | None = None  # the probe's prompt, kept with its answer so a later probe asks the same

    def to_json(self) -> dict[str, Any]:
        probe = None if self.probe is None else {"token": self.probe.token, "logprob": self.probe.logprob}
        return {"digest": self.digest, "probe": probe, "prompt": self.prompt}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> FleetRecord | None:
        if not isinstance(data, dict):
            return None
        probe = data.get("probe")
        try:
            answer = Probe(str(probe["token"]), float(probe["logprob"])) if probe else None
        except (KeyError, TypeError, ValueError):
            answer = None
        return cls(data.get("digest"), answer, data.get("prompt"))


async def fleet_record(session: AsyncSession, version: int) -> FleetRecord | None:
    row = await policies.get_policy(session, version)
    return FleetRecord.from_json((row.evaluation or {}).get(KEY))


async def set_fleet_record(session: AsyncSession, version: int, record: FleetRecord) -> None:
    row = await policies.get_policy(session, version)
    row.evaluation = {**(row.evaluation or {}), KEY: record.to_json()}  # a new dict: JSON changes are not tracked


async def mark(session: AsyncSession, version: int, replica: str, state: str, *, digest: str | None = None,
               reason: str | None = None) -> None:
    """Record that `replica` serves `version` (VERIFIED) or is out of rotation for it (WITHHELD, `reason`)."""
    table = PolicyReplica.__table__
    failures = 0 if state == VERIFIED else table.c.failures + 1
    now = utcnow()
    await session.execute(upsert(
        session, table, ["version", "replica"],
        {"version": version, "replica": replica, "state": state, "digest": digest, "reason": reason,
         "failures": 0 if state == VERIFIED else 1, "updated_at": now},
        {"state": state, "digest": digest, "reason": reason, "failures": failures, "updated_at": now}))


async def withheld(session: AsyncSession, versions: Iterable[int]) -> dict[int, dict[str, str]]:
    """version -> {replica: why} for the replicas out of rotation for these versions."""
    versions = list(versions)
    if not versions:
        return {}
    rows = await session.execute(
        select(PolicyReplica.version, PolicyReplica.replica, PolicyReplica.reason)
        .where(PolicyReplica.state == WITHHELD, PolicyReplica.version.in_(versions)))
    found: dict[int, dict[str, str]] = {}
    for version, replica, reason in rows:
        found.setdefault(version, {})[replica] = reason or ""
    return found


async def states(session: AsyncSession, version: int) -> dict[str, PolicyReplica]:
    """Every replica's row for `version`, by replica URL."""
    rows = await session.execute(select(PolicyReplica).where(PolicyReplica.version == version))
    return {row.replica: row for row in rows.scalars()}
