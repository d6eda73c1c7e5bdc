"""Judge rewards (`rlproxy train --reward judge|judge+posted`, docs/judge.md): rollouts that end without a
posted reward are scored by an LLM judge that compares the trajectories of one task group, so an agent with no
reward code still teaches. Run between training steps by trainer/housekeeping.py.

One run: find the rollouts whose agent has been silent for `judge_idle_s` (no call, no reward) and that still
have no final reward; group them by project and task as the trainer does (a group of `group_size`, or a smaller
one that waited `group_timeout_s`); for each group ask the judge (up to `judge_attempts` times) and store every score as
the rollout's final reward, closing it as `POST /reward` does. A group the judge cannot score is left alone (it
expires by `reward_ttl_s`): no score is ever made up. Judge requests go straight to the judge, never through the
proxy, so they are never recorded as policy calls. There is no default judge (`usage_problem`).

What a tenant reads back (GET /rollouts/{id}) is only its own: a group never spans projects, a score's metadata
names the member's place in its group (not the other members' ids), and a failure is stored as an outcome code;
the judge's URL, error bodies and replies go to the log, the URL without its credentials.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

import aiohttp
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from yarl import URL

from core.errors import RlproxyError
from core.settings import TrainerSettings
from engine.model_list import base_model_name
from rewards.judge import (
    JudgeOutputError,
    Score,
    judge_messages,
    only_redacted,
    parse_scores,
    trajectory_ids,
    trajectory_text,
)
from store import judging
from store.calls import write_calls
from store.judging import IdleRollout
from store.models import utcnow
from store.records import CallRecord
from trainer.metrics import TrainerMetrics

log = logging.getLogger("rlproxy.trainer")

HOLD_S = 900.0  # judge+posted: how long one run's hold on a posted rollout lasts (renewed every run)
JUDGE_AGENT = "rlproxy-judge"  # the agent name the judge's own calls are recorded under


def usage_problem(settings: TrainerSettings) -> str | None:
    """Why these settings cannot give judge rewards (a usage error at start-up), or None."""
    if settings.reward == "posted":
        return None
    if settings.redaction.redact_content:
        return (f"--reward {settings.reward} cannot be used with --redact-content: the judge reads the recorded "
                f"conversations, and with --redact-content every text in them is stored as \"[redacted]\". "
                f"Use --reward posted, or record the text (no --redact-content on rlproxy serve).")
    if not settings.judge_url:
        # There is no default judge: the engine's base model, the obvious candidate, judges at chance when it is
        # the bundled 135M model (bench/results/judge_agreement.txt, docs/judge.md).
        return (f"--reward {settings.reward} needs --judge-url (RLPROXY_JUDGE_URL): the OpenAI-compatible base URL, "
                f"ending in /v1, of a model capable of judging (--judge-model names it, RLPROXY_JUDGE_API_KEY is its "
                f"key). There is no default: the bundled base model judged at chance (docs/judge.md).")
    return None


class JudgeUnreachable(RlproxyError, RuntimeError):
    """The judge did not answer (connection, timeout, a 429 or 5xx): worth another attempt. `code` is what may be
    stored where a tenant reads it (`judge_timeout`, `judge_http_error status 503`); the message is for the log."""

    def __init__(self, detail: str, code: str = "judge_unreachable") -> None:
        super().__init__(detail)
        self.code = code


class JudgeRefused(RlproxyError, RuntimeError):
    """The judge answered the request with an error of ours (4xx: too long a prompt, an unknown model)."""

    def __init__(self, detail: str, code: str = "judge_refused") -> None:
        super().__init__(detail)
        self.code = code


def ready_groups(rollouts: Sequence[IdleRollout], group_size: int, group_timeout_s: float,
                 now: datetime) -> list[list[IdleRollout]]:
    """Task groups to judge now: each full `group_size` of a task, or all of a task's rollouts once the first
    of them has been idle `group_timeout_s` (as the trainer takes groups). A rollout without a task is judged
    alone: there is nothing to compare it with, but the rubric still applies.

    A task is one project's: task ids are often shared names (a benchmark's `gsm8k-17`), and a group shows the
    judge every member's trajectory and stores its reply with each member, so two tenants' rollouts of one task
    id are two groups (rollouts with no project are a pool of their own, as on a proxy without --auth)."""
    by_task: dict[tuple[str | None, str | None], list[IdleRollout]] = defaultdict(list)
    for rollout in sorted(rollouts, key=lambda r: r.last_call_at):
        by_task[(rollout.project, rollout.task_id)].append(rollout)
    groups: list[list[IdleRollout]] = []
    for (_, task_id), members in by_task.items():
        if task_id is None:
            groups.extend([member] for member in members)
            continue
        full = len(members) - len(members) % group_size
        groups.extend(members[start: start + group_size] for start in range(0, full, group_size))
        rest = members[full:]
        if rest and (now - rest[0].last_call_at).total_seconds() >= group_timeout_s:
            groups.append(rest)
    return groups


class JudgeJob:
    def __init__(self, settings: TrainerSettings, sessions: async_sessionmaker[AsyncSession],
                 metrics: TrainerMetrics, *, group_size: int, group_timeout_s: float) -> None:
        self.settings = settings
        self.sessions = sessions
        self.metrics = metrics
        self.group_size = group_size
        self.group_timeout_s = group_timeout_s
        self.with_posted = settings.reward == "judge+posted"
        self.owner = f"{settings.worker_id}/judge"  # the lease owner of posted rollouts waiting for the judge
        problem = usage_problem(settings)
        if problem:
            raise ValueError(problem)
        self.rubric = _read_rubric(settings.judge_rubric)
        self.url = settings.judge_url.rstrip("/")
        self.where, self._secrets = _loggable(self.url)  # the URL as logged and recorded: no userinfo, no query
        # an engine as the judge (a capable base model) takes the engines' key unless the judge has its own
        on_engine = any(self.url.startswith(upstream.rstrip("/") + "/") for upstream in settings.upstreams)
        key = settings.judge_api_key or (settings.upstream_api_key if on_engine else None)
        self.headers = {"Authorization": f"Bearer {key.get_secret_value()}"} if key else {}
        self.model = settings.judge_model  # None: asked of the judge on first use
        self.given_up: dict[str, float] = {}  # rollout id -> monotonic time: not judged again (bad output)

    async def run_once(self) -> int:
        """Judge every group that is ready; how many rollouts got a judge's score."""
        self._forget_expired()
        idle_before = utcnow() - timedelta(seconds=self.settings.judge_idle_s)
        async with self.sessions() as session, session.begin():
            if self.with_posted:
                await judging.hold_posted(session, self.owner, HOLD_S, skip=self.given_up)
            candidates = await judging.idle_open_rollouts(session, idle_before, skip=self.given_up)
            if self.with_posted:  # a posted final reward ended the episode: no silence to wait for
                candidates += await judging.held_posted_rollouts(session, self.owner, utcnow())
        judged = 0
        for group in ready_groups(candidates, self.group_size, self.group_timeout_s, utcnow()):
            try:
                judged += await self.judge_group(group)
            except Exception:  # noqa: BLE001 — one group the judge job trips on never stops the trainer
                self.metrics.judge_groups.labels("error").inc()
                log.exception("judging task %r (%d rollouts) failed; its rollouts are left unjudged (not asked "
                              "again: they expire by reward_ttl_s)", group[0].task_id, len(group))
                await self._release_quietly(group)
        return judged

    async def judge_group(self, group: list[IdleRollout]) -> int:
        ids = [rollout.id for rollout in group]
        async with self.sessions() as session:
            calls = await judging.recorded_calls(session, ids)
        texts = [trajectory_text(calls[i]) for i in ids]
        messages = judge_messages(group[0].task_id, texts, self.rubric)
        try:
            if all(only_redacted(text) for text in texts):  # a proxy runs with --redact-content: nothing to read
                raise JudgeRefused("the recorded text is redacted (rlproxy serve --redact-content), so no judge can "
                                   "read it: run rlproxy train with --redact-content too, which refuses --reward "
                                   f"{self.settings.reward} at start-up, or record the text", "judge_redacted")
            scores = await self._scores(messages, trajectory_ids(len(ids)))
        except (JudgeOutputError, JudgeUnreachable, JudgeRefused) as exc:
            outcome = {JudgeOutputError: "bad_output", JudgeUnreachable: "unreachable",
                       JudgeRefused: "refused"}[type(exc)]
            self.metrics.judge_groups.labels(outcome).inc()
            log.warning("judge gave no scores for task %r (%d rollouts) after %d attempts: %s", group[0].task_id,
                        len(ids), self.settings.judge_attempts, self._scrub(str(exc)))
            # Stored where the group's tenant reads it: the outcome code only. The message may hold the judge's
            # error body or its reply (which can quote a trajectory), so it stays in the log.
            code = exc.code if isinstance(exc, (JudgeUnreachable, JudgeRefused)) else "judge_unparseable"
            await self._give_up(group, retry_later=outcome == "unreachable", why=f"{outcome}: {code}")
            return 0
        stored = 0
        async with self.sessions() as session, session.begin():
            for rollout, key in zip(group, trajectory_ids(len(ids))):
                score = scores[key]
                # The member's place in its group, not the others' ids. The group is one project's (ready_groups),
                # and the judge is asked to explain each trajectory on its own, so its explanation stays here.
                metadata = {"source": "judge", "explanation": score.explanation, "judge_model": self.model,
                            "group": {"position": int(key), "size": len(ids)}}
                if rollout.posted is None:
                    done = await judging.close_with_judge_score(session, rollout.id, score.value, metadata)
                else:
                    done = await judging.weigh_posted_with_judge(session, rollout.id, self.owner, score.value,
                                                                 self.settings.judge_weight, metadata)
                stored += done
        self.metrics.judge_groups.labels("judged").inc()
        self.metrics.judged_rollouts.inc(stored)
        log.info("judge scored task %r: %s", group[0].task_id,
                 ", ".join(f"{s.value:.2f}" for s in scores.values()))
        return stored

    async def _scores(self, messages: list[dict], ids: list[str]) -> dict[str, Score]:
        """The judge's checked scores; the last error once `judge_attempts` requests gave none."""
        error: Exception | None = None
        timeout = aiohttp.ClientTimeout(total=self.settings.judge_timeout_s)
        async with aiohttp.ClientSession(timeout=timeout, headers=self.headers) as client:
            for attempt in range(self.settings.judge_attempts):
                if attempt and isinstance(error, JudgeUnreachable):
                    await asyncio.sleep(min(2.0 ** attempt, 10.0))
                try:
                    return parse_scores(await self._ask(client, messages), ids)
                except (JudgeOutputError, JudgeUnreachable) as exc:
                    error = exc
                    log.info("judge attempt %d of %d: %s", attempt + 1, self.settings.judge_attempts,
                             self._scrub(str(exc)))
        assert error is not None
        raise error

    async def _ask(self, client: aiohttp.ClientSession, messages: list[dict]) -> str:
        try:
            if self.model is None:
                self.model = await self._first_model(client)
            body = {"model": self.model, "messages": messages, "temperature": 0.0}
            if self.settings.judge_max_tokens:
                body["max_tokens"] = self.settings.judge_max_tokens
            began, started = time.perf_counter(), utcnow()
            async with client.post(_endpoint(self.url, "chat/completions"), json=body) as response:
                code = f"judge_http_error status {response.status}"
                if response.status == 429 or response.status >= 500:
                    raise JudgeUnreachable(f"{self.where} answered {response.status}: "
                                           f"{(await response.text(errors='replace'))[:200]}", code)
                if response.status >= 400:
                    raise JudgeRefused(f"{self.where} refused the request ({response.status}): "
                                       f"{(await response.text(errors='replace'))[:200]}", code)
                raw = await response.text(errors="replace")
        except asyncio.TimeoutError:  # (before ClientError: aiohttp's own timeouts are both)
            raise JudgeUnreachable(f"{self.where}: no answer within {self.settings.judge_timeout_s} s",
                                   "judge_timeout") from None
        except aiohttp.ClientError as exc:
            raise JudgeUnreachable(self._scrub(f"{self.where}: {exc!r}"), "judge_connection_error") from None
        try:
            payload = json.loads(raw)
        except ValueError:
            # A 200 that is not JSON at all (a proxy's HTML page, a truncated body) is the judge's bad output:
            # counted and retried like a reply that breaks the contract, never a crash of the trainer.
            kept = {"body": raw[:10_000].replace("\x00", "\\u0000")}  # on record; JSONB holds no NUL
            await self._record(body, kept, started, time.perf_counter() - began)
            raise JudgeOutputError(f"{self.where} answered 200 with a body that is not JSON: {raw[:200]!r}") from None
        await self._record(body, payload, started, time.perf_counter() - began)
        try:
            content = payload["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise JudgeOutputError(f"not a chat completion: {str(payload)[:200]}") from None
        if not isinstance(content, str):
            raise JudgeOutputError("the judge's message has no text content")
        return content

    async def _record(self, request: dict, response: object, started: datetime, seconds: float) -> None:
        """Keep the judge's call in `calls`, for the record: outside any rollout and any policy (agent
        `rlproxy-judge`), so no trainer ever claims or trains on it; pruned like other loose calls."""
        record = CallRecord(id=uuid.uuid4().hex, route="chat", started_at=started, agent=JUDGE_AGENT,
                            model=self.model, upstream_model=self.model, upstream=self.where, request=request,
                            response=response if isinstance(response, dict) else {"body": response},
                            http_status=200, latency_ms=seconds * 1000, finished_at=utcnow(), complete=True)
        async with self.sessions() as session, session.begin():
            await write_calls(session, [record])

    async def _first_model(self, client: aiohttp.ClientSession) -> str:
        """The judge's base model, by the one rule for reading a model list (engine/model_list.py): the first entry
        that adapts no other, so a judge serving LoRA adapters is asked as its base model."""
        async with client.get(_endpoint(self.url, "models")) as response:
            if response.status != 200:
                raise JudgeUnreachable(f"{self.where}/models answered {response.status}; set --judge-model",
                                       f"judge_models_error status {response.status}")
            raw = await response.text(errors="replace")
        try:
            models = json.loads(raw)["data"]
            if not isinstance(models, list) or not all(isinstance(model, dict) and "id" in model
                                                       for model in models):
                raise TypeError("not a list of models")
        except (ValueError, LookupError, TypeError):
            raise JudgeRefused(f"{self.where}/models is not an OpenAI model list ({raw[:100]!r}); is --judge-url an "
                               f"OpenAI-compatible base URL ending in /v1? Else set --judge-model",
                               "judge_models_unreadable") from None
        name = base_model_name(models)
        if name is None:
            raise JudgeUnreachable(f"{self.where}/models lists no base model; set --judge-model",
                                   "judge_models_unreadable")
        return name

    async def _give_up(self, group: list[IdleRollout], *, retry_later: bool, why: str) -> None:
        """Bad output is not asked again: those rollouts expire by reward_ttl_s. For an unreachable judge the
        open rollouts are tried again at the next run; posted ones are released at once either way, to train
        on their posted reward alone rather than wait for a judge that may not come back."""
        now = time.monotonic()
        held = [rollout.id for rollout in group if rollout.posted is not None]
        self.given_up.update((rollout.id, now) for rollout in group if rollout.posted is not None or not retry_later)
        if held:
            async with self.sessions() as session, session.begin():
                await judging.release_held(session, held, self.owner, why)

    async def _release_quietly(self, group: list[IdleRollout]) -> None:
        """After an unexpected failure, as after bad output: not asked again (a failure that repeats would
        otherwise fill the log every run), posted rollouts released. The database may be what failed, so this
        may fail too; then the hold simply runs out."""
        try:
            await self._give_up(group, retry_later=False, why="error: judge_error")
        except Exception as exc:  # noqa: BLE001
            log.warning("could not release the held rollouts of task %r: %s", group[0].task_id, exc)

    def _scrub(self, text: str) -> str:
        """A log line without the judge URL's password or query (which may carry a key)."""
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _forget_expired(self) -> None:
        """Given-up rollouts are remembered until they have surely expired (or restarted trainers forget)."""
        horizon = time.monotonic() - max(self.settings.reward_ttl_s, 3600.0)
        self.given_up = {rollout_id: at for rollout_id, at in self.given_up.items() if at > horizon}


def _endpoint(url: str, path: str) -> str:
    """`path` under the judge's base URL, before its query (a gateway's `?api-version=`, or a key) if it has one."""
    base, mark, query = url.partition("?")
    return f"{base.rstrip('/')}/{path}{mark}{query}"


def _loggable(url: str) -> tuple[str, list[str]]:
    """The judge URL as it may be logged and recorded (no user, password, query or fragment), and the secrets
    to blank out of messages that quote it anyway (an aiohttp error's repr)."""
    try:
        parsed = URL(url)
        shown = str(parsed.with_user(None).with_query(None).with_fragment(None))
        secrets = [part for part in (parsed.password, parsed.raw_password, parsed.query_string,
                                     parsed.raw_query_string) if part]
    except (ValueError, TypeError):
        return "(the judge URL)", [url]
    return shown, sorted(set(secrets), key=len, reverse=True)


def _read_rubric(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return path.read_text()
    except OSError as exc:
        raise ValueError(f"--judge-rubric {path}: {exc.strerror or exc}") from None
