"""Serving one policy call, whatever wire format it speaks: forward to the engine with capture fields, answer in
the agent's format (chunk by chunk when streaming; the engine's own bytes for chat and completions), and hand the
recorded call to the writer whatever happens."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from core.rollout_sampling import RolloutSampling
from proxy.edge import claim_for_call
from proxy.boundary import RequestBoundary, engine_bytes, media_in_prompt
from proxy.capture import (
    Additions,
    StreamAssembler,
    altered_sampling,
    capture_response,
    prepare_upstream_body,
)
from proxy.context import CallContext, call_context
from proxy.dialects.base import ENDED_EARLY, Dialect, Translator, replay
from proxy.errors import ProxyError, StoreUnavailable, UpstreamTimeout, UpstreamUnavailable, engine_failure
from proxy.metrics import ProxyMetrics
from proxy.policy import PolicyRouter
from proxy.recording import redact_record
from proxy.policy import resample
from proxy.schemas import parse_json_object
from proxy.dialects.sse import Event, SSEParser
from proxy.tenancy import ModelAccess
from proxy.upstream import UpstreamPool
from proxy.recording import CaptureWriter
from store.models import CallStatus, utcnow
from store.records import CallRecord

log = logging.getLogger("rlproxy.serving")

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# Earlier turns the proxy keeps for a dialect request (Responses' previous_response_id), as chat messages.
HistoryLoader = Callable[[dict[str, Any], CallContext], Awaitable[list[dict[str, Any]]]]


# An engine answer past this size is captured off the event loop (`_relay_whole`): below it, a thread's hand-off
# costs more than the work.
OFF_LOOP_BYTES = 256 * 1024
RETRY_ADVICE = ("Retry-After", "retry-after-ms", "x-should-retry")


class CompletionServing:
    """Serves the policy calls of one wire format (`dialect`): forward to the engine with capture fields, answer
    in the dialect's format (whole, or event by event), and hand the recorded call to the writer whatever
    happens. Which format it is makes no difference here: that is the dialect's (proxy/dialects/)."""

    def __init__(self, dialect: Dialect, upstreams: UpstreamPool, router: PolicyRouter, writer: CaptureWriter,
                 metrics: ProxyMetrics, access: ModelAccess, boundary: RequestBoundary, *,
                 redact: bool = False, logprobs_mode: str = "processed",
                 rollout_sampling: RolloutSampling | None = None) -> None:
        self.dialect = dialect
        self.rollout_sampling = rollout_sampling or RolloutSampling()  # the operator's, for training rollouts
        self.logprobs_mode = logprobs_mode  # what the engines' log-probs are, recorded on each call
        self.upstreams = upstreams
        self.access = access
        self.boundary = boundary
        self.router = router
        self.writer = writer
        self.metrics = metrics
        self.redact = redact  # store text as a marker (proxy/redact.py)

    async def handle(self, request: web.Request, history: HistoryLoader | None = None, *,
                     path_model: str | None = None) -> web.StreamResponse:
        """Serve one policy call: the agent's body is read and checked at the request boundary
        (proxy/boundary.py) and translated to the engine's request, and the engine's answer back (`history`:
        earlier turns the proxy keeps, for Responses; `path_model`: the model an API names in its path, not its
        body, Gemini's, which the body's `model` then is)."""
        began = time.perf_counter()
        body = parse_json_object(await request.read())
        if path_model is not None:
            body["model"] = path_model
        context = call_context(request)
        dialect, boundary = self.dialect, self.boundary
        boundary.check_common(body)
        boundary.budget.check(body)
        dialect.validate(body, boundary.allowed)
        await self.access.check(body["model"], context.project)  # another project's adapter: as if none existed
        engine_body = dialect.to_chat(body, await history(body, context) if history is not None else ())
        if engine_body is not body:  # translated: what the operator allows besides is carried over
            boundary.carry_allowed(body, engine_body)
            boundary.budget.check(engine_body)  # a budget the API keeps elsewhere (Gemini's generationConfig)
        boundary.check_media(engine_body)
        target = await self.router.route_call(body["model"], context)
        engine_body, override = await resample(self.rollout_sampling, self.router, context, target, engine_body)
        upstream_body, additions = prepare_upstream_body(engine_body, dialect.engine_route, target.upstream_model)
        boundary.budget.bound(upstream_body, dialect.engine_route)
        await claim_for_call(request, context)  # checked, to be recorded: only now may it claim its rollout
        record = CallRecord(
            id=uuid.uuid4().hex, route=dialect.route, started_at=utcnow(),
            rollout_id=context.rollout_id, agent=context.agent, task_id=context.task_id, project=context.project,
            model=body["model"], upstream_model=target.upstream_model, policy_version=target.policy_version,
            policy=target.policy, stream=bool(upstream_body.get("stream")), request=body, eval=context.eval,
            # why its recorded log-probs cannot be trained as its behaviour: its sampling, or media in the prompt
            # media first: a tempered call with an image in its prompt is still one the trainer cannot score
            sampling=media_in_prompt(upstream_body) or altered_sampling(upstream_body),
            logprobs_mode=self.logprobs_mode, sampling_override=override,
        )
        headers = {"X-Rlproxy-Call-Id": record.id}
        if target.policy_version is not None:
            headers["X-Rlproxy-Policy"] = str(target.policy_version)
            headers["X-Rlproxy-Policy-Name"] = target.policy
        self.metrics.in_flight.inc()
        try:
            response = await self._forward(request, record, upstream_body, additions, headers, began)
            if record.finished_at is None:  # (a stream hands its call over before its end)
                await self._hand_over(record, began)
            return response
        except asyncio.CancelledError:
            if not record.complete and record.finished_at is None:
                record.status = CallStatus.CLIENT_DISCONNECTED
            raise
        except ProxyError as exc:
            if record.finished_at is None:
                timed_out = isinstance(exc, UpstreamTimeout)
                record.status = CallStatus.TIMEOUT if timed_out else CallStatus.UPSTREAM_ERROR
                record.http_status, record.error = exc.status, exc.message
                self.metrics.upstream_errors.labels(exc.default_code or exc.type).inc()
                with contextlib.suppress(StoreUnavailable):  # the engine's error is the one to report
                    await self._hand_over(record, began)
            exc.headers = {**(exc.headers or {}), **headers}  # the agent can look up the call it failed
            raise
        finally:
            self.metrics.in_flight.dec()
            if record.finished_at is None:  # cancelled: hand over without waiting
                self._finish(record, began)
                self.writer.submit(record)
                self._account(record)

    async def count_tokens(self, model: str, messages: list[dict[str, Any]], context: CallContext,
                           **extra: Any) -> tuple[int, bytes]:
        """(status, body) of the engine's `/tokenize` of `messages` (and `extra`: tools, template arguments) as a
        call of `model` would be rendered: checked as that call (its project may call the model; the policy
        routes it), neither recorded nor claiming its rollout. The token counting routes answer from it."""
        await self.access.check(model, context.project)
        target = await self.router.route_call(model, context)
        body = {"model": target.upstream_model, "messages": messages, "add_generation_prompt": True, **extra}
        return await self.upstreams.tokenize(engine_bytes(body), key=context.rollout_id)

    def _finish(self, record: CallRecord, began: float) -> None:
        record.finished_at = utcnow()
        record.latency_ms = (time.perf_counter() - began) * 1000
        if self.redact:
            redact_record(record)

    async def _hand_over(self, record: CallRecord, began: float) -> None:
        """Give the finished call to the writer; with `sync` durability it is on disk when this returns, so
        the agent's answer is only completed for a call that is recorded (one the spool could not keep is
        counted, and stored, as `store_error`)."""
        self._finish(record, began)
        try:
            await self.writer.commit(record)
        finally:
            self._account(record)

    async def _forward(self, request: web.Request, record: CallRecord, upstream_body: dict, additions: Additions,
                       headers: dict[str, str], began: float) -> web.StreamResponse:
        replica, upstream = await self.upstreams.open(self.dialect.engine_path, engine_bytes(upstream_body),
                                                      key=record.rollout_id, model=record.upstream_model)
        record.upstream = replica.url
        record.http_status = upstream.status
        try:
            if upstream.status != 200:
                return await self._relay_error(upstream, record, headers)
            # The engine answered a stream request with one body: recorded as what it was; a translating dialect
            # still answers the stream its API promises (built from that body), the engine's formats relay it.
            replayed = record.stream and upstream.content_type != "text/event-stream"
            if replayed:
                record.stream = False
            translator = self.dialect.translator(record.request, record.id, _now(), additions)
            if record.stream:
                return await self._relay_stream(request, upstream, record, additions, headers, began, translator)
            return await self._relay_whole(upstream, record, headers, translator,
                                           as_stream=replayed and self.dialect.translates)
        except asyncio.TimeoutError:
            raise UpstreamTimeout("engine did not finish in time") from None
        except aiohttp.ClientError as exc:
            raise engine_failure("engine connection failed", exc) from None
        finally:
            upstream.close()  # releases an unfinished request so the engine aborts it

    async def _relay_error(self, upstream: aiohttp.ClientResponse, record: CallRecord,
                           headers: dict[str, str]) -> web.Response:
        """Engine errors (4xx/5xx) reach the agent with their status and message, in its route's shape: an
        OpenAI-shaped one as it is, any other body (an HTML page from a gateway, plain text) wrapped in the
        shape, so a client never gets HTML under an error it parses as JSON. Recorded as they came."""
        raw = await upstream.read()
        record.status = CallStatus.UPSTREAM_ERROR
        record.error = raw.decode("utf-8", errors="replace")[:4000]
        body = self.dialect.engine_error(upstream.status, raw)
        # The engine's advice on retrying goes to the agent too: without it an SDK retries a 429 or 503 at its own
        # pace (each retry another failed call), or retries what the engine said not to.
        advice = {name: upstream.headers[name] for name in RETRY_ADVICE if name in upstream.headers}
        return web.Response(body=body, status=upstream.status, headers={**headers, **advice},
                            content_type="application/json")

    async def _relay_whole(self, upstream: aiohttp.ClientResponse, record: CallRecord, headers: dict[str, str],
                           translator: Translator, *, as_stream: bool = False) -> web.Response:
        """The engine's one body, answered whole, or (`as_stream`) as the translator's whole event stream. A large
        one is parsed, captured and rewritten in a worker thread: one answer of 20,000 choices held every
        tenant's requests, `/healthz` included, for two seconds on the event loop."""
        raw = await upstream.read()
        if len(raw) > OFF_LOOP_BYTES:
            return await asyncio.to_thread(self._answer_whole, raw, upstream, record, headers, translator, as_stream)
        return self._answer_whole(raw, upstream, record, headers, translator, as_stream)

    def _answer_whole(self, raw: bytes, upstream: aiohttp.ClientResponse, record: CallRecord,
                      headers: dict[str, str], translator: Translator, as_stream: bool) -> web.Response:
        try:
            payload = orjson.loads(raw)
        except orjson.JSONDecodeError:
            record.status, record.error = CallStatus.UPSTREAM_ERROR, "engine returned invalid JSON"
            # a translating dialect raises (502 in its shape); the engine's own formats relay what it sent
            return web.Response(body=translator.whole(None, raw, None), status=upstream.status, headers=headers,
                                content_type=upstream.content_type)
        record.prompt_token_ids, record.choices = capture_response(self.dialect.engine_route, payload)
        if as_stream:
            body = replay(translator, payload, _tokens(record, payload))
            record.response = translator.final
            return web.Response(body=body, headers={**headers, **SSE_HEADERS})
        body = translator.whole(payload, raw, _tokens(record, payload))
        record.response = translator.final
        return web.Response(body=body, headers=headers, content_type="application/json")

    async def _relay_stream(self, request: web.Request, upstream: aiohttp.ClientResponse, record: CallRecord,
                            additions: Additions, headers: dict[str, str], began: float,
                            translator: Translator) -> web.StreamResponse:
        response = web.StreamResponse(headers={**headers, **SSE_HEADERS})
        await response.prepare(request)
        assembler = StreamAssembler(self.dialect.engine_route)
        parser = SSEParser()
        done: Event | None = None  # the engine's [DONE]: what follows it is the engine's EOF
        tail = b""  # the stream's last bytes, sent once the call is handed over
        try:
            async for data in upstream.content.iter_any():
                done = await self._relay_events(response, parser.feed(data), assembler, record, began, translator)
                if done is not None:
                    break
            else:
                done = await self._relay_events(response, parser.flush(), assembler, record, began, translator)
        except ConnectionResetError:
            if not record.complete:
                record.status = CallStatus.CLIENT_DISCONNECTED
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            timed_out = isinstance(exc, asyncio.TimeoutError)
            error = (UpstreamTimeout("engine stream timed out") if timed_out
                     else engine_failure("engine connection lost mid-stream", exc))
            record.status = CallStatus.TIMEOUT if timed_out else CallStatus.UPSTREAM_ERROR
            record.error = error.message
            self.metrics.upstream_errors.labels(error.default_code).inc()
            tail = _error_event(error, translator)
        finally:
            record.prompt_token_ids = assembler.prompt_ids
            record.choices = assembler.choice_records()
            record.response = assembler.response(additions.requested_model)
        cut_short = not record.complete and not tail and record.status == CallStatus.OK
        if cut_short:  # the engine closed its stream without [DONE]: the agent is told, and it is never trained on
            record.status, record.error = CallStatus.UPSTREAM_ERROR, ENDED_EARLY[1]
            self.metrics.upstream_errors.labels(UpstreamUnavailable.default_code).inc()
        if record.complete or cut_short:  # the translator ends a stream cut short with an error event
            tail = translator.finish(record.response, _tokens(record, record.response), done)
        if translator.final is not None:
            record.response = translator.final  # what the agent received (a failed Responses stream's too)
        try:
            await self._hand_over(record, began)
        except StoreUnavailable as exc:
            tail = _error_event(exc, translator)
        await _write_some_quietly(response, tail)
        await _eof_quietly(response)
        return response

    async def _relay_events(self, response: web.StreamResponse, events: list[Event], assembler: StreamAssembler,
                            record: CallRecord, began: float, translator: Translator) -> Event | None:
        """Send the agent its bytes for `events`, up to the engine's [DONE] (returned, and not sent: the stream's
        end is sent once the call is handed over)."""
        for event in events:
            if event.is_done:
                record.complete = True
                return event
            await _write_some(response, self._relay_event(event, assembler, record, began, translator))
        return None

    def _relay_event(self, event: Event, assembler: StreamAssembler, record: CallRecord, began: float,
                     translator: Translator) -> bytes:
        chunk = _chunk(event)
        if chunk is None:
            return translator.feed(None, event, len(assembler.prompt_ids or ()))
        if "error" in chunk and "choices" not in chunk:
            record.status, record.error = CallStatus.UPSTREAM_ERROR, orjson.dumps(chunk["error"]).decode()
            error = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            return translator.error(500, str(error.get("message")), str(error.get("type")), None, event)
        assembler.feed(chunk)
        if record.ttft_ms is None and _has_output(chunk):
            record.ttft_ms = (time.perf_counter() - began) * 1000
        return translator.feed(chunk, event, len(assembler.prompt_ids or ()))

    def _account(self, record: CallRecord) -> None:
        route = record.route  # each wire format's calls are counted under its own route
        policy = "" if record.policy_version is None else str(record.policy_version)
        status = record.status if record.status != CallStatus.OK else str(record.http_status or 0)
        self.metrics.requests.labels(route, status, policy).inc()
        self.metrics.request_duration.labels(route, str(record.stream).lower()).observe(
            (record.latency_ms or 0) / 1000)
        if record.stream and record.ttft_ms is not None:
            self.metrics.ttft.labels(route).observe(record.ttft_ms / 1000)
        if record.prompt_token_ids is not None:
            self.metrics.tokens.labels("prompt").inc(len(record.prompt_token_ids))
        if record.completion_tokens:
            self.metrics.tokens.labels("completion").inc(record.completion_tokens)


def _now() -> int:
    return int(time.time())


def _tokens(record: CallRecord, payload: dict) -> tuple[int, int]:
    """The prompt's and choice 0's token counts, from the recorded ids (exact), else the engine's usage."""
    usage = payload.get("usage") or {}
    first = record.choices[0] if record.choices else None
    prompt = len(record.prompt_token_ids) if record.prompt_token_ids is not None else usage.get("prompt_tokens", 0)
    completion = (len(first.token_ids) if first is not None and first.token_ids is not None
                  else usage.get("completion_tokens", 0))
    return prompt or 0, completion or 0


def _chunk(event: Event) -> dict[str, Any] | None:
    """The engine chunk an event carries: its data as a JSON object (None for a comment, or text that is not one)."""
    if event.data is None:
        return None
    try:
        chunk = orjson.loads(event.data)
    except orjson.JSONDecodeError:
        return None
    return chunk if isinstance(chunk, dict) else None


def _error_event(error: ProxyError, translator: Translator) -> bytes:
    return translator.error(error.status, error.message, error.type, error.code or error.default_code)


def _has_output(chunk: dict) -> bool:
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        if choice.get("text") or delta.get("content") or delta.get("tool_calls") or choice.get("token_ids"):
            return True
    return False


async def _write_some(response: web.StreamResponse, data: bytes) -> None:
    if data:
        await response.write(data)


async def _write_some_quietly(response: web.StreamResponse, data: bytes) -> None:
    try:
        await _write_some(response, data)
    except ConnectionResetError:
        pass


async def _eof_quietly(response: web.StreamResponse) -> None:
    try:
        await response.write_eof()
    except ConnectionResetError:
        pass
