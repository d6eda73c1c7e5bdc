"""What an engine (or a proxy in front of it) serves, read from its OpenAI model list: the one rule for which
listed model is the base model. vLLM lists each loaded LoRA adapter with `parent` naming the model it adapts;
the base model is the entry without one."""
from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

import aiohttp

from core.errors import RlproxyError


class ModelListError(RlproxyError):
    """The model list could not be read, or names no base model."""


def base_model_name(models: Iterable[Mapping[str, Any]]) -> str | None:
    """The first listed model that adapts no other (None when every entry is an adapter or the list is empty)."""
    for model in models:
        if isinstance(model, Mapping) and not model.get("parent") and model.get("id") is not None:
            return str(model["id"])
    return None


async def list_models(url: str, api_key: str | None = None, timeout: float = 30) -> list[dict[str, Any]]:
    """`GET {url}/v1/models`'s entries; `url` is the base URL without /v1."""
    endpoint = f"{url.rstrip('/')}/v1/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout), headers=headers) as http:
            async with http.get(endpoint) as response:
                if response.status != 200:
                    raise ModelListError(f"GET {endpoint}: HTTP {response.status} {(await response.text())[:300]}")
                body = await response.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        raise ModelListError(f"GET {endpoint}: {exc!r}") from None
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        raise ModelListError(f"GET {endpoint}: not an OpenAI model list")
    return [model for model in data if isinstance(model, dict)]


async def base_model(url: str, api_key: str | None = None) -> str:
    """The base model's name on an engine or proxy (`url` without /v1)."""
    name = base_model_name(await list_models(url, api_key))
    if name is None:
        raise ModelListError(f"{url} lists no base model")
    return name
