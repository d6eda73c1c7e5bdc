"""What the trainer asks of the store: which rewarded rollouts are ready, a lease on them, their calls and
rewards, and — in one transaction with the step's record — marking them trained (so a crash trains nothing
twice and loses nothing: an unfinished step's leases simply expire)."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, case, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from store.dialect import database_now
from store.errors import LeaseLost
from store.judging import judge_had_its_say
from store.models import (
    as_utc,
    Call,
    CallChoice,
    CallStatus,
    Reward,
    RewardKind,
    Rollout,
    RolloutStatus,
    TrainStep,
    utcnow,
)


@dataclass(slots=True)
class CallData:
    id: str
    seq: int
    agent: str | None
    policy_version: int | None
    prompt_ids: list[int] | None
    prefix_kind: str | None
    choices: list[tuple[list[int] | None, list[float] | None]]  # (token ids, logprobs) per choice
    rewards: list[float] = field(default_factory=list)  # intermediate rewards (posted and automatic)
    policy: str | None = None  # the named policy that answered it
    started_at: datetime | None = None  # when the proxy sent it to the engine: its age counts as staleness
    sampling: str | None = None  # how it was sampled, as far as its log-probs depend on it (core/sampling_rules.py)
    logprobs_mode: str | None = None  # 'processed', 'raw', or None: recorded before the column, i.e. raw


@dataclass(slots=True)
class RolloutData:
    id: str
    task_id: str | None
    reward: float | None  # None: closed without a final reward (store/closing.py), trained by a teacher alone
    finished_at: datetime
    calls: list[CallData]
    agent: str | None = None  # the agent the rollout was created for: its calls' agent unless they name one
    project: str | None = None  # whose it is: a task id names a task only within its project


def _unleased(now: datetime):
    return or_(Rollout.lease_expires_at.is_(None), Rollout.lease_expires_at < now)


def _trainable(agents: Sequence[str] = (), judged: bool = False):
    """Finished, untrained and not evaluation traffic (`rollouts.eval`); with `agents`, also not created for
    some other agent (an evaluation agent's rollouts, say, are never training data). Rollouts created without
    an agent always qualify. (The same conditions as the partial index `ix_rollouts_trainable`.) With `judged`
    (reward judge+posted), also judged, or given up on by the judge (store/judging.py)."""
    condition = and_(Rollout.status == RolloutStatus.FINISHED, Rollout.trained_at.is_(None), ~Rollout.eval)
    if agents:
        condition = and_(condition, or_(Rollout.agent.is_(None), Rollout.agent.in_(list(agents))))
    if judged:
        condition = and_(condition, judge_had_its_say())
    return condition


async def mark_eval_agents(session: AsyncSession, agents: Sequence[str]) -> list[tuple[int | None, float]]:
    """Mark the finished, untrained rollouts created for one of `agents` (`rlproxy train --eval-agents`) as
    evaluation traffic, so they are never claimed and `GET /policies` reports them. Returns (policy version,
    final reward) of each rollout marked now."""
    if not agents:
        return []
    result = await session.execute(
        update(Rollout).where(_trainable(), Rollout.agent.in_(list(agents)))
        .values(eval=True).returning(Rollout.policy_version, Rollout.reward))
    return [(version, float(reward)) for version, reward in result]


async def ready_rollouts(session: AsyncSession, *, limit: int, group_size: int, group_timeout_s: float,
                         batch_timeout_s: float = 0.0, agents: Sequence[str] = (), judged: bool = False,
                         most: int | None = None, settle_s: float = 0.0) -> list[str]:
    """Finished, untrained, unleased rollouts whose task group is complete (or waited long enough), whole groups
    only, at least about `limit` when that many are ready and at most about `most` (default `limit`: a backlog
    larger than one batch is taken whole up to `most`), the groups whose oldest member finished first first;
    fewer than `limit` only once the oldest of them has waited `batch_timeout_s`. `judged`: only rollouts the
    judge has had its say on (judge+posted). `settle_s`: only rollouts finished at least that long ago (another
    proxy may still hold their last calls).

    Groups are counted over every waiting rollout, not over a window of the oldest: traffic that interleaves many
    tasks completes its groups anywhere in the queue, and a complete group never waits for a timeout because
    older partial groups lie ahead of it. Rollouts without a task are always ready."""
    now = await database_now(session)  # finish times are the database's (store/dialect.py)
    full, limit = limit, max(limit, most or limit)
    waiting = and_(_trainable(agents, judged), _unleased(now))
    if settle_s > 0:
        waiting = and_(waiting, Rollout.finished_at <= now - timedelta(seconds=settle_s))
    oldest = func.min(Rollout.finished_at)
    ready = or_(Rollout.task_id.is_(None), func.count() >= group_size,
                oldest <= now - timedelta(seconds=group_timeout_s))
    # every group but the first holds at least one rollout that fits, so `limit` groups are always enough;
    # a task id names a task within its project (two projects may both run "gsm8k-17"), so groups are per project
    groups = (await session.execute(
        select(Rollout.project, Rollout.task_id, func.count(), oldest).where(waiting)
        .group_by(Rollout.project, Rollout.task_id).having(ready)
        .order_by(oldest, Rollout.project, Rollout.task_id).limit(limit)
    )).all()
    wanted: dict[tuple[str | None, str | None], int] = {}
    finished: list[datetime] = []
    for project, task_id, count, first in groups:
        # whole groups of `group_size`; a group that waited long enough goes as it is
        take = count - count % group_size if task_id is not None and count >= group_size else count
        if task_id is not None and take > limit:  # one task's backlog (an id reused for many attempts): a cap too
            take = max(group_size, limit - limit % group_size)
        if task_id is None:
            take = min(count, max(1, limit - sum(wanted.values())))
        if wanted and sum(wanted.values()) + take > limit:
            break
        wanted[(project, task_id)] = take
        finished.append(as_utc(first))
    if not wanted:
        return []
    if sum(wanted.values()) < full and (now - min(finished)).total_seconds() < batch_timeout_s:
        return []  # a fuller batch is worth the wait
    return await _members(session, waiting, wanted)


async def _members(session: AsyncSession, waiting, wanted: dict[tuple[str | None, str | None], int]) -> list[str]:
    """The oldest `wanted[(project, task)]` waiting rollouts of each group, oldest first (no more rows read than
    that)."""
    place = func.row_number().over(partition_by=(Rollout.project, Rollout.task_id),
                                   order_by=(Rollout.finished_at, Rollout.id))
    ranked = select(Rollout.id, Rollout.project, Rollout.task_id, Rollout.finished_at, place.label("place")).where(
        waiting, or_(*(_group_is(Rollout.project, Rollout.task_id, *key) for key in wanted))).subquery()
    quota = case(*((_group_is(ranked.c.project, ranked.c.task_id, *key), n) for key, n in wanted.items()), else_=0)
    return list((await session.execute(select(ranked.c.id).where(ranked.c.place <= quota)
                                       .order_by(ranked.c.finished_at, ranked.c.id))).scalars())


def _group_is(project_column, task_column, project: str | None, task_id: str | None):
    """The rows of one (project, task) group; None matches NULL."""
    return and_(project_column.is_(None) if project is None else project_column == project,
                task_column.is_(None) if task_id is None else task_column == task_id)


def _finished_first(rollout: Rollout) -> tuple[bool, datetime]:
    """Oldest finished first; a row with no finish time (written by hand, or by an older version) last."""
    return rollout.finished_at is None, as_utc(rollout.finished_at or datetime.max)


async def lease(session: AsyncSession, rollout_ids: list[str], owner: str, seconds: float, *,
                judged: bool = False) -> list[str]:
    """Take a lease on those of `rollout_ids` nobody else holds (row locks skipped, not waited for)."""
    now = await database_now(session)  # another trainer compares the lease's end with its own `now`
    query = select(Rollout.id).where(Rollout.id.in_(rollout_ids), _trainable(judged=judged), _unleased(now))
    if session.get_bind().dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    got = list((await session.execute(query)).scalars())
    if got:
        await session.execute(update(Rollout).where(Rollout.id.in_(got)).values(
            lease_owner=owner, lease_expires_at=now + timedelta(seconds=seconds)))
    return got


async def release(session: AsyncSession, rollout_ids: list[str], owner: str) -> None:
    await session.execute(update(Rollout).where(Rollout.id.in_(rollout_ids), Rollout.lease_owner == owner)
                          .values(lease_owner=None, lease_expires_at=None))


async def release_untrained(session: AsyncSession, worker_id: str) -> int:
    """Drop the leases on untrained rollouts of every earlier run of `worker_id` (owners `worker_id` and
    `worker_id:<run>`): a restarted worker takes back what its dead predecessor held instead of waiting for the
    leases to expire. Returns how many were released."""
    result = await session.execute(update(Rollout).where(_earlier_runs(worker_id), Rollout.trained_at.is_(None))
                                   .values(lease_owner=None, lease_expires_at=None))
    return result.rowcount or 0


async def hold_leases(session: AsyncSession, rollout_ids: list[str], owner: str) -> None:
    """Lock the step's rollouts for the caller's transaction, or raise `LeaseLost` when any is no longer leased
    to `owner` (untrained): its lease expired during a long step and another worker took it, or another process
    started with the same worker id took it back. Recording the step anyway would train those rollouts twice."""
    query = select(Rollout.id).where(Rollout.id.in_(rollout_ids), Rollout.lease_owner == owner,
                                     Rollout.trained_at.is_(None))
    if session.get_bind().dialect.name == "postgresql":
        query = query.with_for_update()
    held = set((await session.execute(query)).scalars())
    if len(held) != len(set(rollout_ids)):
        raise LeaseLost(f"{len(set(rollout_ids)) - len(held)} of the step's {len(set(rollout_ids))} rollouts are no "
                        f"longer leased to {owner!r}; the step is not recorded")


def _earlier_runs(worker_id: str):
    return or_(Rollout.lease_owner == worker_id, Rollout.lease_owner.startswith(f"{worker_id}:", autoescape=True))


async def begin_attempt(session: AsyncSession, rollout_ids: list[str], owner: str) -> None:
    """Count a step begun over these rollouts, before it runs: one that never finishes (a rank that raised,
    ran out of memory or died stops every rank) is known to the restarted trainer (`unfinished_attempts`)."""
    await session.execute(update(Rollout).where(Rollout.id.in_(rollout_ids), Rollout.lease_owner == owner)
                          .values(step_attempts=Rollout.step_attempts + 1))


async def note_step_error(session: AsyncSession, rollout_ids: list[str], error: str) -> None:
    """Keep the failure a step over these rollouts ended with (what the set-aside record will say)."""
    await session.execute(update(Rollout).where(Rollout.id.in_(rollout_ids)).values(step_error=error))


async def unfinished_attempts(session: AsyncSession, worker_id: str, attempts: int) -> dict[str | None, list[str]]:
    """The untrained rollouts an earlier run of `worker_id` held whose steps began `attempts` times or more and
    never finished, by the last error noted on them (None: none was)."""
    rows = await session.execute(select(Rollout.id, Rollout.step_error).where(
        _earlier_runs(worker_id), Rollout.trained_at.is_(None), Rollout.step_attempts >= attempts)
        .order_by(Rollout.finished_at, Rollout.id))
    failed: dict[str | None, list[str]] = defaultdict(list)
    for rollout_id, error in rows:
        failed[error].append(rollout_id)
    return dict(failed)


async def load_rollouts(session: AsyncSession, rollout_ids: list[str]) -> list[RolloutData]:
    rollouts = (await session.execute(select(Rollout).where(Rollout.id.in_(rollout_ids)))).scalars().all()
    calls = (await session.execute(
        select(Call.id, Call.rollout_id, Call.seq, Call.agent, Call.policy_version, Call.prompt_token_ids,
               Call.prefix_kind, Call.policy, Call.started_at, Call.sampling, Call.logprobs_mode)
        .where(Call.rollout_id.in_(rollout_ids), Call.status == CallStatus.OK).order_by(Call.seq)
    )).all()
    by_call: dict[str, CallData] = {}
    per_rollout: dict[str, list[CallData]] = defaultdict(list)
    rollout_agent = {r.id: r.agent for r in rollouts}
    for (call_id, rollout_id, seq, agent, version, prompt_ids, prefix_kind, policy, started_at, sampling,
         logprobs_mode) in calls:
        # a call made on the rollout's plain base_url (no /agents/{name}/) is the rollout's agent's
        data = CallData(call_id, seq, agent or rollout_agent.get(rollout_id), version, prompt_ids, prefix_kind, [],
                        policy=policy, started_at=started_at, sampling=sampling, logprobs_mode=logprobs_mode)
        by_call[call_id] = data
        per_rollout[rollout_id].append(data)
    if by_call:
        choices = await session.execute(
            select(CallChoice.call_id, CallChoice.token_ids, CallChoice.logprobs)
            .where(CallChoice.call_id.in_(list(by_call))).order_by(CallChoice.call_id, CallChoice.index))
        for call_id, token_ids, logprobs in choices:
            by_call[call_id].choices.append((token_ids, logprobs))
        rewards = await session.execute(
            select(Reward.call_id, Reward.value)
            .where(Reward.call_id.in_(list(by_call)), Reward.kind.in_([RewardKind.CALL, RewardKind.AIR])))
        for call_id, value in rewards:
            by_call[call_id].rewards.append(value)
    return [RolloutData(r.id, r.task_id, None if r.reward is None else float(r.reward), r.finished_at,
                        per_rollout.get(r.id, []), r.agent, r.project)
            for r in sorted(rollouts, key=_finished_first)]


async def load_call_texts(session: AsyncSession, call_ids: list[str]) -> dict[str, tuple[dict | None, dict | None]]:
    """call id -> (request, response) as recorded (for the re-tokenization ablation, trainer/retokenize.py)."""
    rows = await session.execute(select(Call.id, Call.request, Call.response).where(Call.id.in_(call_ids)))
    return {call_id: (request, response) for call_id, request, response in rows}


async def record_step(session: AsyncSession, rollout_ids: list[str], owner: str, *, policy_version: int | None,
                      transition_count: int, metrics: dict[str, Any], decisions: dict[str, str] | None = None,
                      undecided: str | None = None) -> int:
    """Record a finished step and mark its rollouts trained, in the caller's transaction. `decisions` (call id ->
    'trained' or the skip reason) is stored on each call (`calls.train_decision`); `undecided` on the rollouts'
    calls that have none yet."""
    step = TrainStep(policy_version=policy_version, rollout_count=len(rollout_ids),
                     transition_count=transition_count, metrics=metrics)
    session.add(step)
    await session.flush()
    await session.execute(update(Rollout).where(Rollout.id.in_(rollout_ids)).values(
        trained_at=utcnow(), train_step_id=step.id, lease_owner=None, lease_expires_at=None))
    await store_decisions(session, rollout_ids, decisions or {}, undecided)
    return step.id


async def store_decisions(session: AsyncSession, rollout_ids: list[str], decisions: dict[str, str],
                           undecided: str | None = None) -> None:
    """Store what the trainer decided on each call of these rollouts (`calls.train_decision`); `undecided` on the
    rest. One statement per reason (a step decides thousands of calls, under a handful of reasons)."""
    by_reason: dict[str, list[str]] = defaultdict(list)
    for call_id, reason in decisions.items():
        by_reason[reason].append(call_id)
    for reason, call_ids in by_reason.items():
        await session.execute(update(Call).where(Call.id.in_(call_ids), Call.rollout_id.in_(rollout_ids))
                              .values(train_decision=reason[:64]))
    if undecided is not None:
        await session.execute(update(Call).where(Call.rollout_id.in_(rollout_ids), Call.train_decision.is_(None))
                              .values(train_decision=undecided[:64]))


async def waiting_rollouts(session: AsyncSession, agents: Sequence[str] = ()) -> int:
    return int((await session.execute(
        select(func.count()).select_from(Rollout).where(_trainable(agents)))).scalar_one())


def _finished(include_trained: bool):
    finished = Rollout.status == RolloutStatus.FINISHED
    return finished if include_trained else and_(finished, Rollout.trained_at.is_(None))


async def finished_groups(session: AsyncSession, *, include_trained: bool, after: tuple[str, str] | None,
                          limit: int) -> list[tuple[str | None, str]]:
    """A page of the (project, task) groups of finished rollouts with a task, in that order, after `after` (the
    last of the page before): whole groups, so an export computes each group's advantages over all of it, and
    keyed, so rows written or trained meanwhile neither skip nor repeat a group (`rlproxy export`)."""
    project, task = func.coalesce(Rollout.project, ""), Rollout.task_id
    query = select(project, task).where(_finished(include_trained), task.is_not(None)).group_by(project, task)
    if after is not None:
        query = query.where(or_(project > after[0], and_(project == after[0], task > after[1])))
    rows = (await session.execute(query.order_by(project, task).limit(limit))).all()
    return [(p or None, t) for p, t in rows]


async def finished_in_groups(session: AsyncSession, groups: list[tuple[str | None, str]], *,
                             include_trained: bool) -> list[str]:
    """The finished rollouts of `groups`, oldest finished first."""
    if not groups:
        return []
    query = select(Rollout.id).where(_finished(include_trained), or_(
        *(_group_is(Rollout.project, Rollout.task_id, project, task) for project, task in groups)))
    return list((await session.execute(query.order_by(Rollout.finished_at, Rollout.id))).scalars())


async def finished_without_task(session: AsyncSession, *, include_trained: bool,
                                after: tuple[datetime, str] | None, limit: int) -> list[tuple[datetime, str]]:
    """A page of finished rollouts that name no task, as (finished_at, id), after `after` (keyed, as above)."""
    query = select(Rollout.finished_at, Rollout.id).where(_finished(include_trained), Rollout.task_id.is_(None))
    if after is not None:
        query = query.where(or_(Rollout.finished_at > after[0],
                                and_(Rollout.finished_at == after[0], Rollout.id > after[1])))
    return [tuple(row) for row in
            (await session.execute(query.order_by(Rollout.finished_at, Rollout.id).limit(limit))).all()]
