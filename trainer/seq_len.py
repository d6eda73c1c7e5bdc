"""`max_seq_len` 0 (the default): the longest call the engines serve, read from their model lists.

An engine allocates `--max-model-len` tokens per sequence and lists it as `max_model_len` beside its base model
(`GET /v1/models`); no call it answered is longer. A fixed trainer bound below it (2048 against 4096 before)
dropped every longer call, the late turns of long rollouts, nearest the reward. A call too long for one
micro-batch is still trained: as a micro-batch of its own, with activation checkpointing (trainer/ppo.py).
"""
from __future__ import annotations

import dataclasses
import logging

from core.settings import TrainerSettings
from engine.model_list import ModelListError, list_models

log = logging.getLogger("rlproxy.trainer")

UNBOUNDED = 1 << 30  # no engine said: every call is kept, the longest as a micro-batch of its own


async def with_engine_seq_len(settings: TrainerSettings) -> TrainerSettings:
    """`settings` with max_seq_len resolved: as set, or (0) the smallest base `max_model_len` the engines list."""
    if settings.training.max_seq_len > 0:
        return settings
    key = settings.upstream_api_key.get_secret_value() if settings.upstream_api_key else None
    lengths = []
    for url in settings.upstreams:
        try:
            models = await list_models(url, key)
        except ModelListError as exc:
            log.warning("max_seq_len 0: %s; that engine's max_model_len is not known", exc)
            continue
        lengths += [int(m["max_model_len"]) for m in models
                    if not m.get("parent") and isinstance(m.get("max_model_len"), int) and m["max_model_len"] > 1]
    length = min(lengths) if lengths else UNBOUNDED
    if not lengths:
        log.warning("max_seq_len 0: no engine listed its max_model_len; no call is dropped for its length")
    else:
        log.info("max_seq_len %d: the engines' max_model_len", length)
    return settings.model_copy(update={"training": dataclasses.replace(settings.training, max_seq_len=length)})
