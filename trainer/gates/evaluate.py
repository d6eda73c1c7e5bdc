"""`rlproxy eval --policy vN`: measure one policy version with the evidence the gates use, and say which set
each number is from (docs/gates.md):

    --command CMD   your evaluation command (the command gate's), on its `heldout` split unless --split says
                    otherwise; the gate decides on split `gate`, so a report never reuses the decision set
    --traffic       the evaluation traffic the version served (rollouts marked eval), with a 95% interval;
                    the eval-traffic gate's own decision counts only those since its canary started
    neither         the bundled demo task's held-out evaluation (demo/evaluate.py)

A command runs against an engine (`--upstream`, which loads the adapter from its row's path when needed) or a
running proxy (`--proxy`, which passes the adapter's name through; the adapter must be loaded).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import aiohttp
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession

from core.errors import RlproxyError
from engine import lifecycle
from engine.adapters import AdapterError, EngineAdapters
from engine.model_list import base_model_name
from store import policies, verdicts
from store.db import short_session
from store.evaluation import traffic_by_version
from store.models import Policy
from trainer.gates.command import digest, run_command


class EvalError(RlproxyError):
    """A policy cannot be evaluated as asked (no such version, adapter not reachable, engine refused)."""


@dataclass(frozen=True)
class Target:
    url: str  # base URL without /v1
    model: str  # the name to ask for there
    row: Policy | None  # None: the base model


async def _get_json(url: str, api_key: str | None) -> Any:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30), headers=headers) as http:
            async with http.get(url) as response:
                if response.status != 200:
                    raise EvalError(f"GET {url}: HTTP {response.status} {(await response.text())[:300]}")
                return await response.json()
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise EvalError(f"GET {url}: {exc!r}") from None


async def resolve(version: int, database_url: str, *, proxy: str | None, upstream: str | None,
                  api_key: str | None) -> Target:
    """Where policy `version` is served and under which name; loads its adapter on an engine if needed."""
    if (proxy is None) == (upstream is None):
        raise EvalError("evaluate through a proxy or on an engine: give exactly one of them")
    row = None
    url = (upstream or proxy).rstrip("/")
    if version != policies.BASE_VERSION:
        async with short_session(database_url) as sessions:
            async with sessions() as session:
                row = await session.get(Policy, version)
            if row is None:
                raise EvalError(f"policy v{version} does not exist in {hide_password(database_url)}")
            if upstream is not None:
                await load(sessions, url, version, api_key)
    models = {m["id"]: m for m in (await _get_json(f"{url}/v1/models", api_key))["data"]}
    if upstream is not None:
        if row is not None:
            return Target(url, row.name, row)
        return Target(url, _base(models, url), None)
    if row is not None:
        if row.name not in models:
            raise EvalError(f"{row.name} is not loaded on the engine behind {url}; evaluate it with "
                            "--upstream ENGINE_URL, which loads it")
        return Target(url, row.name, row)
    active = (await _get_json(f"{url}/policies", api_key))["active"]
    if active != policies.BASE_VERSION:
        raise EvalError(f"{url} answers the base model's name with policy v{active}; evaluate v0 with "
                        "--upstream ENGINE_URL")
    return Target(url, _base(models, url), None)


async def load(sessions, engine: str, version: int, api_key: str | None) -> None:
    """Make the version's adapter, with its own folder's weights, loaded on the engine (the lifecycle's rule: it
    may have been unloaded after it stopped serving, or the engine restarted)."""
    try:
        await lifecycle.ensure_loaded(sessions, EngineAdapters([engine], api_key=api_key, attempts=2), version)
    except (AdapterError, aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise EvalError(f"{engine} could not load policy v{version}: {exc}") from None


def _base(models: dict[str, dict], url: str) -> str:
    name = base_model_name(models.values())
    if name is None:
        raise EvalError(f"{url} lists no base model")
    return name


async def by_command(version: int, template: str, split: str, database_url: str, *, proxy: str | None,
                     upstream: str | None, api_key: str | None, timeout: float):
    """Run the evaluation command for `version`; keep its score (a `command_eval` verdict of that split)."""
    target = await resolve(version, database_url, proxy=proxy, upstream=upstream, api_key=api_key)
    result = await run_command(template, base_url=f"{target.url}/v1", model=target.model, version=version,
                               split=split, timeout=timeout, api_key=api_key)
    if not result.ok:
        raise EvalError(result.describe())
    if target.row is None:
        return result, False
    async with short_session(database_url) as sessions, sessions() as session, session.begin():
        await verdicts.add(session, version, verdicts.COMMAND_EVAL, split=split, measured=digest(template, split),
                           score=result.score, evidence={"n": result.n, "seconds": round(result.seconds, 2)})
    return result, True


async def by_traffic(version: int, database_url: str) -> list[str]:
    """Lines describing the evaluation traffic `version` served, beside the active version's."""
    async with short_session(database_url) as sessions, sessions() as session:
        return await _traffic_lines(session, version)


async def _traffic_lines(session: AsyncSession, version: int) -> list[str]:
    """The version's evaluation traffic; beside it the version an eval-traffic gate compared it with, or else
    the active one; then what that gate decided on (a subset: the rollouts since its canary started)."""
    traffic = await traffic_by_version(session)
    canary = await verdicts.record(session, version, verdicts.CANARY) or {}
    judged = canary.get("traffic") == "eval" and "rollouts" in canary
    other = canary["active_version"] if judged else (await policies.active_policy(session)).version
    lines = [_describe_traffic(version, traffic.get(version))]
    if other != version:
        role = "what the gate compared it with" if judged else "the active version"
        lines.append(f"{_describe_traffic(other, traffic.get(other))} ({role})")
    if judged:
        lines.append(f"the eval-traffic gate decided on {canary['rollouts']} of v{version}'s evaluation rollouts "
                     f"(those since {canary['started_at']}): mean {canary['mean_reward']:.4g} vs "
                     f"v{other} {canary['active_mean_reward']:.4g} -> "
                     f"{'promoted' if canary.get('promoted') else 'retired'}")
    return lines


def _describe_traffic(version: int, summary: dict[str, Any] | None) -> str:
    if not summary or not summary["n"]:
        return f"v{version}: no finished evaluation rollouts"
    interval = summary["ci95"]
    ci = f", 95% CI {interval[0]:.4g}–{interval[1]:.4g} ({summary['interval']})" if interval else ""
    return f"v{version}: evaluation traffic mean reward {summary['mean']:.4g} over {summary['n']} rollouts{ci}"


def hide_password(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)
