"""The objects one proxy process shares between its routes, kept on the aiohttp app."""
from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from core.settings import ProxySettings
from proxy.boundary import RequestBoundary
from proxy.ingest import RewardIngest
from proxy.metrics import ProxyMetrics
from proxy.policy import PolicyRouter
from proxy.serving import CompletionServing
from proxy.tenancy import ModelAccess
from proxy.upstream import UpstreamPool
from proxy.recording import CaptureWriter


@dataclass(slots=True)
class ProxyState:
    settings: ProxySettings
    database: AsyncEngine  # the store's connection pool (store/db.py)
    sessions: async_sessionmaker[AsyncSession]
    metrics: ProxyMetrics
    upstreams: UpstreamPool
    router: PolicyRouter
    writer: CaptureWriter
    serving: dict[str, CompletionServing]  # by route: one per wire format (proxy/dialects/)
    access: ModelAccess  # which models a key's project may call
    boundary: RequestBoundary  # the checks every body crosses before the engine (proxy/boundary.py)
    ingest: RewardIngest  # rewards, events and spans the agents report (proxy/ingest.py)


STATE = web.AppKey("rlproxy_state", ProxyState)


def state(request: web.Request) -> ProxyState:
    return request.app[STATE]
