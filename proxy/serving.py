"""Serving one OpenAI completion call: forward to the engine with capture fields, relay the answer exactly
(chunk by chunk when streaming), and hand the recorded call to the writer whatever happens."""
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

from proxy.capture import (CHAT, Additions, StreamAssembler, capture_response, only_for_capture,
                           prepare_upstream_body, relay_bytes, strip_additions)
from proxy.context import CallContext, call_context
from proxy.dialects import Dialect, Output, StreamTranslator
from proxy.dialects.base import openai_engine_error
from proxy.errors import ProxyError, StoreUnavailable, UpstreamTimeout, UpstreamUnavailable, sse_error_event
from proxy.metrics import ProxyMetrics
from proxy.policy import PolicyRouter
from proxy.redact import redact_record
from proxy.schemas import ChatCompletionRequest, CompletionRequest, parse_json_object, validate
from proxy.sse import Event, SSEParser
from proxy.tenancy import ModelAccess
from proxy.upstream import UpstreamPool
from proxy.writer import CaptureWriter
from store.models import CallStatus, utcnow
from store.records import CallRecord

log = logging.getLogger("rlproxy.serving")

PATHS = {CHAT: "/v1/chat/completions", "completions": "/v1/completions"}
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# Earlier turns the proxy keeps for a dialect request (Responses' previous_response_id), as chat messages.
HistoryLoader = Callable[[dict[str, Any], CallContext], Awaitable[list[dict[str, Any]]]]


class CompletionServing:
    def __init__(self, upstreams: UpstreamPool, router: PolicyRouter, writer: CaptureWriter,
                 metrics: ProxyMetrics, access: ModelAccess, *, redact: bool = False) -> None:
        self.upstreams = upstreams
        self.access = access
        self.router = router
        self.writer = writer
        self.metrics = metrics
        self.redact = redact  # store text as a marker (proxy/redact.py)

    async def handle(self, request: web.Request, route: str, dialect: Dialect | None = None,
                     history: HistoryLoader | None = None) -> web.StreamResponse:
        """Serve one policy call on `route` (chat or completions). With a `dialect` (Responses, Messages) the
        agent's body is translated to a chat request, and the engine's answer back (proxy/dialects/)."""
        began = time.perf_counter()
        body = parse_json_object(await request.read())
        context = call_context(request)
        engine_body = body
        if dialect is None:
            validate(ChatCompletionRequest if route == CHAT else CompletionRequest, body)
        else:
            dialect.validate(body)
        await self.access.check(body["model"], context.project)  # another project's adapter: as if none existed
        if dialect is not None:
            engine_body = dialect.to_chat(body, await history(body, context) if history is not None else [])
        target = await self.router.route_call(body["model"], context)
        upstream_body, additions = prepare_upstream_body(engine_body, route, target.upstream_model)
        record = CallRecord(
            id=uuid.uuid4().hex, route=dialect.route if dialect else route, started_at=utcnow(),
            rollout_id=context.rollout_id, agent=context.agent, task_id=context.task_id, project=context.project,
            model=body["model"], upstream_model=target.upstream_model, policy_version=target.policy_version,
            policy=target.policy, stream=bool(body.get("stream")), request=body, eval=context.eval,
        )
        headers = {"X-Rlproxy-Call-Id": record.id}
        if target.policy_version is not None:
            headers["X-Rlproxy-Policy"] = str(target.policy_version)
            headers["X-Rlproxy-Policy-Name"] = target.policy
        self.metrics.in_flight.inc()
        try:
            response = await self._forward(request, route, record, upstream_body, additions, headers, began,
                                           dialect)
            if record.finished_at is None:  # (a stream hands its call over before its end)
                await self._hand_over(route, record, began)
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
                    await self._hand_over(route, record, began)
            raise
        finally:
            self.metrics.in_flight.dec()
            if record.finished_at is None:  # cancelled: hand over without waiting
                self._finish(route, record, began)
                self.writer.submit(record)

    def _finish(self, route: str, record: CallRecord, began: float) -> None:
        record.finished_at = utcnow()
        record.latency_ms = (time.perf_counter() - began) * 1000
        self._account(route, record)
        if self.redact:
            redact_record(record)

    async def _hand_over(self, route: str, record: CallRecord, began: float) -> None:
        """Give the finished call to the writer; with `sync` durability it is on disk when this returns, so
        the agent's answer is only completed for a call that is recorded."""
        self._finish(route, record, began)
        await self.writer.commit(record)

    async def _forward(self, request: web.Request, route: str, record: CallRecord, upstream_body: dict,
                       additions: Additions, headers: dict[str, str], began: float,
                       dialect: Dialect | None) -> web.StreamResponse:
        replica, upstream = await self.upstreams.open(PATHS[route], orjson.dumps(upstream_body),
                                                      key=record.rollout_id, model=record.upstream_model)
        record.upstream = replica.url
        record.http_status = upstream.status
        try:
            if upstream.status != 200:
                return await self._relay_error(upstream, record, headers, dialect)
            if record.stream and upstream.content_type != "text/event-stream":
                record.stream = False  # the engine answered a stream request with one body: record what it was
            if record.stream:
                translator = dialect.stream(record.request, record.id, _now()) if dialect else None
                return await self._relay_stream(request, upstream, route, record, additions, headers, began,
                                                translator)
            if dialect is not None:
                return await self._translate_json(upstream, record, headers, dialect)
            return await self._relay_json(upstream, route, record, additions, headers)
        except asyncio.TimeoutError:
            raise UpstreamTimeout("engine did not finish in time") from None
        except aiohttp.ClientError as exc:
            raise UpstreamUnavailable(f"engine connection failed: {exc}") from None
        finally:
            upstream.close()  # releases an unfinished request so the engine aborts it

    async def _relay_error(self, upstream: aiohttp.ClientResponse, record: CallRecord,
                           headers: dict[str, str], dialect: Dialect | None) -> web.Response:
        """Engine errors (4xx/5xx) reach the agent with their status and message, in its route's shape: an
        OpenAI-shaped one as it is, any other body (an HTML page from a gateway, plain text) wrapped in the
        shape, so a client never gets HTML under an error it parses as JSON. Recorded as they came."""
        raw = await upstream.read()
        record.status = CallStatus.UPSTREAM_ERROR
        record.error = raw.decode("utf-8", errors="replace")[:4000]
        body = dialect.engine_error(upstream.status, raw) if dialect is not None else openai_engine_error(
            upstream.status, raw)
        return web.Response(body=body, status=upstream.status, headers=headers, content_type="application/json")

    async def _translate_json(self, upstream: aiohttp.ClientResponse, record: CallRecord,
                              headers: dict[str, str], dialect: Dialect) -> web.Response:
        raw = await upstream.read()
        try:
            payload = orjson.loads(raw)
        except orjson.JSONDecodeError:
            record.status, record.error = CallStatus.UPSTREAM_ERROR, "engine returned invalid JSON"
            raise UpstreamUnavailable("engine returned invalid JSON") from None
        record.prompt_token_ids, record.choices = capture_response(CHAT, payload)
        record.response = dialect.build_response(record.request, _output(record, payload), record.id, _now())
        return web.Response(body=orjson.dumps(record.response), headers=headers, content_type="application/json")

    async def _relay_json(self, upstream: aiohttp.ClientResponse, route: str, record: CallRecord,
                          additions: Additions, headers: dict[str, str]) -> web.Response:
        raw = await upstream.read()
        try:
            payload = orjson.loads(raw)
        except orjson.JSONDecodeError:
            record.status, record.error = CallStatus.UPSTREAM_ERROR, "engine returned invalid JSON"
            return web.Response(body=raw, status=upstream.status, headers=headers,
                                content_type=upstream.content_type)
        record.prompt_token_ids, record.choices = capture_response(route, payload)
        body = relay_bytes(raw, payload, additions)
        record.response = strip_additions(payload, additions)
        return web.Response(body=body, headers=headers, content_type="application/json")

    async def _relay_stream(self, request: web.Request, upstream: aiohttp.ClientResponse, route: str,
                            record: CallRecord, additions: Additions, headers: dict[str, str],
                            began: float, translator: StreamTranslator | None) -> web.StreamResponse:
        response = web.StreamResponse(headers={**headers, **SSE_HEADERS})
        await response.prepare(request)
        assembler = StreamAssembler(route)
        parser = SSEParser()
        tail = b""  # the stream's last event, sent once the call is handed over
        try:
            async for data in upstream.content.iter_any():
                for event in parser.feed(data):
                    if event.is_done:
                        record.complete, tail = True, event.raw  # what follows is the engine's EOF
                        break
                    await _write_some(response, self._relay_event(event, assembler, additions, record, began,
                                                                  translator))
                if record.complete:
                    break
            if not record.complete:
                for event in parser.flush():
                    await _write_some(response, self._relay_event(event, assembler, additions, record, began,
                                                                  translator))
        except ConnectionResetError:
            if not record.complete:
                record.status = CallStatus.CLIENT_DISCONNECTED
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            timed_out = isinstance(exc, asyncio.TimeoutError)
            error = (UpstreamTimeout("engine stream timed out") if timed_out
                     else UpstreamUnavailable(f"engine connection lost mid-stream: {exc}"))
            record.status = CallStatus.TIMEOUT if timed_out else CallStatus.UPSTREAM_ERROR
            record.error = error.message
            self.metrics.upstream_errors.labels(error.default_code).inc()
            tail = _error_event(error, translator)
        finally:
            record.prompt_token_ids = assembler.prompt_ids
            record.choices = assembler.choice_records()
            record.response = assembler.response(additions.requested_model)
        if translator is not None and record.complete:
            tail = translator.finish(_output(record, record.response))
        elif translator is not None and not tail and record.status == CallStatus.OK:
            tail = translator.error(502, "the engine ended the stream early", "upstream_error", None)
        if translator is not None and translator.final is not None:
            record.response = translator.final  # what the agent received (a failed Responses stream's too)
        try:
            await self._hand_over(route, record, began)
        except StoreUnavailable as exc:
            tail = _error_event(exc, translator)
        await _write_some_quietly(response, tail)
        await _eof_quietly(response)
        return response

    def _relay_event(self, event: Event, assembler: StreamAssembler, additions: Additions,
                     record: CallRecord, began: float, translator: StreamTranslator | None) -> bytes:
        if event.data is None or event.is_done:
            return event.raw if translator is None else b""
        try:
            chunk = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            return event.raw
        if not isinstance(chunk, dict):
            return event.raw
        if "error" in chunk and "choices" not in chunk:
            record.status, record.error = CallStatus.UPSTREAM_ERROR, orjson.dumps(chunk["error"]).decode()
            if translator is not None:
                error = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
                return translator.error(500, str(error.get("message")), str(error.get("type")), None)
            return event.raw
        assembler.feed(chunk)
        if record.ttft_ms is None and _has_output(chunk):
            record.ttft_ms = (time.perf_counter() - began) * 1000
        if translator is not None:
            return translator.feed(chunk, len(assembler.prompt_ids or ()))
        if record.route == CHAT and only_for_capture(chunk, additions):
            return b""
        if not additions.any:
            return event.raw
        return b"data: " + relay_bytes(event.data.encode(), chunk, additions) + b"\n\n"

    def _account(self, route: str, record: CallRecord) -> None:
        route = record.route  # a dialect's calls are counted under their own route
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


def _output(record: CallRecord, payload: dict) -> Output:
    """The engine's answer (choice 0) with token counts from the recorded ids, which are exact."""
    usage = payload.get("usage") or {}
    first = record.choices[0] if record.choices else None
    prompt = len(record.prompt_token_ids) if record.prompt_token_ids is not None else usage.get("prompt_tokens", 0)
    completion = (len(first.token_ids) if first is not None and first.token_ids is not None
                  else usage.get("completion_tokens", 0))
    return Output.from_chat(payload, prompt or 0, completion or 0)


def _error_event(error: ProxyError, translator: StreamTranslator | None) -> bytes:
    if translator is None:
        return sse_error_event(error)
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
