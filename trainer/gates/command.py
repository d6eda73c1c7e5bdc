"""The `command` gate and `rlproxy eval --command`: the user's own evaluation script scores a policy.

The script is run through the shell with its placeholders filled in (each value shell-quoted):

    {base_url}  an OpenAI-compatible base URL ending in /v1 that serves the policy (an engine by default)
    {model}     the model name to ask for there: the adapter's name (`rlproxy-vN-<random>`, as `GET /policies` lists it) or the base model's
    {version}   the policy version (0: the base model)
    {split}     "gate" when a gate decides, "heldout" when `rlproxy eval` reports; a script that keeps its
                own decision and report sets apart chooses by it

and the same values in its environment (OPENAI_BASE_URL, OPENAI_API_KEY, RLPROXY_EVAL_MODEL,
RLPROXY_EVAL_VERSION, RLPROXY_EVAL_SPLIT), so an unmodified `openai`-SDK script needs no flags at all. It
prints one JSON line `{"score": x, "n": k}` (`n`, the number of items scored, is optional); the last such line
of its standard output counts. Its output goes to the trainer's log, line by line.

Each failure gets its own verdict and none is a score: a run past `eval_timeout` (its process group is
killed), a non-zero exit, or no JSON line with a finite score. The gate then does not promote the candidate.
A parent that cannot be scored (not servable, or its run fails) leaves nothing to compare with, so every
candidate would be retired: that is an alert (an ERROR line starting "ALERT command gate", the counter
`rlproxy_trainer_gate_parent_unscored_total{why}`) saying what the gate needs, and the stored reason says it too.
The parent's score on the same command and split is measured once and kept as a verdict (its own, or for the
base model, which has no row, on the child's; store/verdicts.py `parent_score` finds it), so each candidate
costs one run.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import shlex
import signal
import string
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from core.errors import RlproxyError
from core.promotion import promotes
from core.settings import PLACEHOLDER_KEY, TrainerSettings
from engine import lifecycle
from engine.adapters import AdapterError, EngineAdapters
from engine.model_list import ModelListError, base_model
from store import policies, verdicts
from store.db import short_session
from store.models import Policy

log = logging.getLogger("rlproxy.gates")

PLACEHOLDERS = ("base_url", "model", "version", "split")
GATE, HELDOUT = "gate", "heldout"  # the two splits: what a gate decides on, what `rlproxy eval` reports
KEY = verdicts.COMMAND_GATE  # the kind of a gate's verdicts, and its record's name in a policy's `evaluation`
KILL_GRACE_S = 5.0  # after SIGTERM, before SIGKILL


class EvalCommandError(RlproxyError, ValueError):
    """An evaluation command template that cannot be run (an unknown placeholder, unbalanced braces)."""


def check_template(template: str) -> str:
    """Return `template` if every {placeholder} in it is known; raise EvalCommandError otherwise."""
    try:
        names = {field for _, field, _, _ in string.Formatter().parse(template) if field is not None}
    except ValueError as exc:
        raise EvalCommandError(f"eval command {template!r}: {exc}") from None
    unknown = sorted(n for n in names if n not in PLACEHOLDERS)
    if unknown:
        raise EvalCommandError(f"eval command {template!r}: unknown placeholder(s) {', '.join(unknown)}; "
                               f"known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)}")
    return template


def digest(template: str, split: str) -> str:
    """Names what was measured, so scores are only compared when command and split are the same."""
    return hashlib.sha256(f"{split}\n{template}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class CommandScore:
    """One run of the command for one policy."""

    version: int
    model: str
    split: str
    score: float | None  # None: the run gave no score (verdict says why)
    n: int | None
    verdict: str  # "ok", "timeout", "exit", "no-score", "not-started"
    detail: str
    seconds: float
    returncode: int | None

    @property
    def ok(self) -> bool:
        return self.score is not None

    def describe(self) -> str:
        where = "the gate's decision set" if self.split == GATE else "the held-out set"
        if not self.ok:
            return f"v{self.version}: no score on {where} (split={self.split}): {self.detail}"
        count = f" over {self.n}" if self.n is not None else ""
        return f"v{self.version}: score {self.score:.4g}{count} on {where} (split={self.split})"


def parse_score(lines: list[str]) -> tuple[float, int | None] | None:
    """The last line that is a JSON object with a finite numeric `score` (and, if present, an integer n >= 0)."""
    for line in reversed(lines):
        line = line.strip()
        if not (line.startswith("{") and line.endswith("}")):
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        score, n = value.get("score"), value.get("n")
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
            continue
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
            continue
        return float(score), n
    return None


async def run_command(template: str, *, base_url: str, model: str, version: int, split: str,
                      timeout: float, api_key: str | None = None, tail: int = 50) -> CommandScore:
    """Run the evaluation command once for one policy and read its score (module docstring)."""
    values = {"base_url": base_url, "model": model, "version": str(version), "split": split}
    command = check_template(template).format(**{k: shlex.quote(v) for k, v in values.items()})
    env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": api_key or PLACEHOLDER_KEY,
           "RLPROXY_EVAL_BASE_URL": base_url, "RLPROXY_EVAL_MODEL": model, "RLPROXY_EVAL_VERSION": str(version),
           "RLPROXY_EVAL_SPLIT": split}
    began = time.monotonic()

    def result(score=None, n=None, verdict="ok", detail="", returncode=None) -> CommandScore:
        return CommandScore(version, model, split, score, n, verdict, detail, time.monotonic() - began, returncode)

    log.info("eval v%d (%s, split=%s): %s", version, model, split, command)
    try:
        process = await asyncio.create_subprocess_shell(
            command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL,
            env=env, start_new_session=True)  # its own process group: a timeout kills its children too
    except OSError as exc:
        return result(verdict="not-started", detail=f"could not start: {exc}")
    stdout: list[str] = []
    stderr: list[str] = []
    readers = asyncio.gather(_pump(process.stdout, stdout, version, "out"),
                             _pump(process.stderr, stderr, version, "err"))
    began = time.monotonic()
    try:
        await asyncio.wait_for(asyncio.shield(readers), timeout)
        # a command that closed its output and went on running is still within the same bound
        returncode = await asyncio.wait_for(process.wait(), max(0.0, timeout - (time.monotonic() - began)))
    except asyncio.TimeoutError:
        await _kill(process)
        readers.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await readers
        return result(verdict="timeout", detail=f"timed out after {timeout:g} s (killed)",
                      returncode=process.returncode)
    except asyncio.CancelledError:
        await _kill(process)
        raise
    if returncode != 0:
        last = (stderr or stdout or ["(no output)"])[-1].strip()
        return result(verdict="exit", detail=f"exited with status {returncode}: {last[:300]}", returncode=returncode)
    parsed = parse_score(stdout[-tail:] if tail else stdout)
    if parsed is None:
        return result(verdict="no-score", returncode=returncode,
                      detail='printed no JSON line like {"score": 0.42, "n": 48} on its standard output')
    return result(score=parsed[0], n=parsed[1], returncode=returncode)


async def _pump(stream: asyncio.StreamReader, into: list[str], version: int, what: str) -> None:
    while line := await stream.readline():
        text = line.decode(errors="replace").rstrip("\n")
        into.append(text)
        log.info("eval v%d %s| %s", version, what, text)


async def _kill(process: asyncio.subprocess.Process) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            await asyncio.wait_for(process.wait(), KILL_GRACE_S)
            return
        except asyncio.TimeoutError:
            continue


def parent_needs(parent: int, model: str | None, base_url: str) -> str:
    """What the gate needs to score a parent, said where it cannot (stored reason, alert line, docs/gates.md)."""
    if parent == policies.BASE_VERSION:
        served = f"the base model served at {base_url}" + (f" as {model!r}" if model else "")
    else:
        served = (f"v{parent}'s adapter folder still on disk and loadable into every engine, to be served as "
                  f"{model!r} at {base_url}")
    return (f"the command gate needs a score of the parent v{parent} to compare with, so it needs {served}, and "
            f"the evaluation command to exit 0 with a JSON line like {{\"score\": 0.42}} for it as for the candidate")


class CommandGate:
    """`--gate command`: score the candidate (and, once, its parent) with `eval_command` on split "gate"."""

    def __init__(self, settings: TrainerSettings, metrics=None) -> None:
        if not settings.eval_command:
            raise EvalCommandError("the command gate needs an evaluation command (--eval-command)")
        if not settings.upstreams and not settings.eval_base_url:
            raise EvalCommandError("the command gate needs an engine (--upstream) or --eval-base-url")
        self.settings = settings
        self.template = check_template(settings.eval_command)
        self.digest = digest(self.template, GATE)
        key = settings.upstream_api_key
        self.api_key = key.get_secret_value() if key else None
        self.base_url = settings.eval_base_url or f"{settings.upstreams[0].rstrip('/')}/v1"
        self.metrics = metrics  # trainer.metrics.TrainerMetrics: parents the gate could not score

    async def score(self, version: int, model: str) -> CommandScore:
        return await run_command(self.template, base_url=self.base_url, model=model, version=version, split=GATE,
                                 timeout=self.settings.eval_timeout, api_key=self.api_key)

    async def _score_parent(self, sessions, parent: int, parent_row: Policy | None) -> tuple[float | None, str]:
        """The parent's score, or None and why not (then the alert is raised and counted)."""
        model = parent_row.name if parent_row is not None else None
        try:
            if parent_row is not None:  # it may have been unloaded since it stopped serving
                await lifecycle.ensure_loaded(sessions, EngineAdapters(self.settings.upstreams, api_key=self.api_key),
                                              parent)
            else:
                model = await base_model(self.base_url.removesuffix("/v1"), api_key=self.api_key)
        except (AdapterError, ModelListError, aiohttp.ClientError, asyncio.TimeoutError) as exc:
            return None, self._parent_unscored(parent, model, "not-served", f"it cannot be served: {exc}")
        measured = await self.score(parent, model)
        log.info("gate: %s", measured.describe())
        if not measured.ok:
            return None, self._parent_unscored(parent, model, measured.verdict, measured.detail)
        if parent_row is not None:
            async with sessions() as session, session.begin():
                await _store(session, parent, measured, self.digest)
        return measured.score, ""

    def _parent_unscored(self, parent: int, model: str | None, why: str, detail: str) -> str:
        """Without a parent score every candidate is retired, so this is an operator's alarm, not a verdict."""
        if self.metrics is not None:
            self.metrics.gate_parent_unscored.labels(why).inc()
        reason = f"the parent v{parent} could not be scored ({detail}); {parent_needs(parent, model, self.base_url)}"
        log.error("ALERT command gate: %s. Every candidate is retired until the parent can be scored "
                  "(rlproxy_trainer_gate_parent_unscored_total).", reason)
        return reason

    async def __call__(self, version: int) -> bool:
        async with short_session(self.settings.database_url) as sessions:
            async with sessions() as session:
                candidate = await policies.get_policy(session, version)
                parent = candidate.parent_version or policies.BASE_VERSION
                parent_row = None if parent == policies.BASE_VERSION else await policies.get_policy(session, parent)
                parent_score = await verdicts.parent_score(session, parent, self.digest)
            problem = ""
            if parent_score is None:
                parent_score, problem = await self._score_parent(sessions, parent, parent_row)
            result = await self.score(version, candidate.name)
            log.info("gate: %s", result.describe())
            if parent_score is None:
                promoted, reason = False, problem
            elif not result.ok:
                promoted, reason = False, result.detail
            else:
                promoted = promotes(result.score, parent_score, self.settings.gate_margin)
                reason = (f"{result.score:.4g} vs parent v{parent} {parent_score:.4g}, "
                          f"margin {self.settings.gate_margin:g}")
            async with sessions() as session, session.begin():
                await _store(session, version, result, self.digest, parent=parent, parent_score=parent_score,
                             margin=self.settings.gate_margin, promoted=promoted, reason=reason)
            log.info("command gate v%d -> %s (%s)", version, "promoted" if promoted else "not promoted", reason)
            return promoted


async def _store(session, version: int, result: CommandScore, measured: str, *, parent: int | None = None,
                 parent_score: float | None = None, promoted: bool | None = None, **evidence: Any) -> None:
    """Record a score of `version` (with `promoted`, the gate's verdict on it against `parent`)."""
    await verdicts.add(session, version, KEY, split=result.split, measured=measured, score=result.score,
                       parent_version=parent, parent_score=parent_score, promoted=promoted, evidence={
                           "version": result.version, "model": result.model, "n": result.n,
                           "verdict": result.verdict, "detail": result.detail, "seconds": round(result.seconds, 2),
                           "returncode": result.returncode, "set": result.split, **evidence})
