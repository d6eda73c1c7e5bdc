"""Each completion token's text, for the web view's rollout page: ids as the policy's tokenizer spells them.

    texts = await token_texts(state, [call["completion_token_ids"], ...])   # one list of strings per list of ids

The tokenizer is the engine's: every version of a policy is an adapter on the engines' one base model, so the
base model's tokenizer is each policy's. Each distinct id is decoded alone by the engine's `/detokenize` (the
proxy ships without a tokenizer library, and an engine reached over the network shares no disk with it), a few at
a time, and kept per base model (`CACHE_IDS` ids): a page of calls asks for the ids no earlier page asked for.
A token decoded alone is its own text; one byte of a character split over several tokens reads as U+FFFD.
What cannot be decoded (no engine up, an id the engine refuses) is None: the page shows the id instead.
"""
from __future__ import annotations

import asyncio
import logging
import weakref
from collections import OrderedDict

import orjson

from core.errors import RlproxyError
from proxy.errors import ProxyError
from proxy.state import ProxyState

log = logging.getLogger("rlproxy.proxy")

CACHE_IDS = 200_000  # ids kept per base model (a vocabulary is 50k-260k)
AT_ONCE = 16  # /detokenize requests in flight for one page
MOST_NEW = 4_096  # distinct ids decoded for one page; past it the rest show as ids (a page of odd calls)
DECODE_S = 5.0  # one id's answer; an engine slower than that is taken as away (the page must not hang on it)


class TokenCache:
    def __init__(self) -> None:
        self.model: str | None = None
        self.texts: OrderedDict[int, str] = OrderedDict()

    def for_model(self, model: str) -> OrderedDict[int, str]:
        if model != self.model:  # another base model: another tokenizer
            self.model, self.texts = model, OrderedDict()
        return self.texts

    def keep(self, token: int, text: str) -> None:
        self.texts[token] = text
        if len(self.texts) > CACHE_IDS:
            self.texts.popitem(last=False)


_caches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # UpstreamPool -> TokenCache


class EngineAway(RlproxyError):
    """The engine could not be asked (not a refusal of one id): no id of the page is asked for after it."""


async def _decode(app: ProxyState, model: str, token: int) -> str | None:
    body = orjson.dumps({"model": model, "tokens": [token]})
    try:
        _, response = await app.upstreams.open("/detokenize", body, headers=app.upstreams.headers)
        async with response:
            if response.status != 200:
                return None
            text = orjson.loads(await response.read()).get("prompt")
    except ValueError:
        return None
    except (ProxyError, OSError, asyncio.TimeoutError) as exc:
        raise EngineAway(str(exc)) from exc
    return text if isinstance(text, str) else None


async def token_texts(app: ProxyState, id_lists: list[list[int] | None]) -> list[list[str | None] | None]:
    """The text of each id of each list (None for a list that is None, and for an id not decoded). An engine
    that cannot be reached ends the asking at once: the page shows the ids it has no text for."""
    model = app.router.base_model
    if model is None:
        return [None if ids is None else [None] * len(ids) for ids in id_lists]
    cache = _caches.setdefault(app.upstreams, TokenCache())
    known = cache.for_model(model)
    wanted = list(dict.fromkeys(t for ids in id_lists for t in ids or () if isinstance(t, int) and t not in known))
    gate = asyncio.Semaphore(AT_ONCE)
    away: list[str] = []

    async def one(token: int) -> None:
        async with gate:
            if away:
                return
            try:
                text = await asyncio.wait_for(_decode(app, model, token), DECODE_S)
            except (EngineAway, asyncio.TimeoutError) as exc:
                away.append(str(exc) or f"no answer within {DECODE_S:g} s")
                return
        if text is not None:
            cache.keep(token, text)

    await asyncio.gather(*(one(t) for t in wanted[:MOST_NEW]))
    if away:
        log.info("the web view shows token ids without text: the engine's /detokenize did not answer (%s)", away[0])
    return [None if ids is None else [known.get(t) if isinstance(t, int) else None for t in ids] for ids in id_lists]
