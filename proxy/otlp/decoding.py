"""OTLP exports decoded in worker processes, never on the event loop: reading a protobuf or JSON export and
turning its spans into `SpanFacts` is CPU work that grows with what the sender packed into the body (2 MB of
protobuf can hold a million empty spans), and a thread would still hold the interpreter lock while protobuf's
parser runs. A process takes the body, checks it against the export budget first (proxy/otlp/export.py) and sends
back the spans' facts or why it refused them; the loop meanwhile serves everyone else."""
from __future__ import annotations

import asyncio
import logging
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from aiohttp import web

from core.settings import IngestSettings
from proxy.errors import InvalidRequest, PayloadTooLarge, ProxyError
from proxy.otlp.export import ExportBudget, OtlpFormatError, OtlpTooLarge, SpanFacts, decode_request, span_facts
from proxy.otlp.share import ProjectShares, Share

log = logging.getLogger("rlproxy.otlp")


class DecoderUnavailable(ProxyError):
    """503: the worker decoding the export stopped (killed, out of memory); the exporter may send it again."""

    status = 503
    type = "service_unavailable"
    default_code = "decoder_unavailable"


@dataclass(frozen=True, slots=True)
class _Decoded:
    """What a worker sends back (exceptions with fields of their own do not cross processes intact)."""

    spans: list[SpanFacts] | None = None
    error: str | None = None
    code: str | None = None
    too_large: bool = False


def _decode(body: bytes, content_type: str, budget: ExportBudget) -> _Decoded:
    """In the worker: the export's span facts, or why it is refused."""
    try:
        return _Decoded(spans=span_facts(decode_request(body, content_type, budget)))
    except OtlpFormatError as exc:
        return _Decoded(error=str(exc), code=exc.code, too_large=isinstance(exc, OtlpTooLarge))


class OtlpDecoders:
    """The worker processes of one proxy: started with its first export (most proxies never receive one),
    stopped with the proxy."""

    def __init__(self, settings: IngestSettings) -> None:
        self.budget = ExportBudget(settings.otlp_max_spans, settings.otlp_max_attributes)
        self.workers = settings.otlp_decoders
        self.shares = ProjectShares(settings.otlp_project_bytes, settings.otlp_decoders)
        self._pool: ProcessPoolExecutor | None = None

    def _started(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # spawn: a forked copy of a process with an event loop, threads and open sockets is not safe to run
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
        return self._pool

    def admit(self, project: str | None, size: int | None, content_type: str) -> Share:
        """The export's place in its project's share, taken before its body is read; DecodersBusy (429) past it."""
        return self.shares.admit(project, size, content_type)

    async def span_facts(self, body: bytes, content_type: str, project: str | None = None) -> list[SpanFacts]:
        """The export's spans, decoded in the project's turn; InvalidRequest (400) for what is not an export,
        PayloadTooLarge (413) for one past the budget."""
        try:
            async with self.shares.turn(project):  # the pool never queues: its queue would be first come, first served
                decoded = await asyncio.wrap_future(self._started().submit(_decode, body, content_type, self.budget))
        except BrokenProcessPool:  # a worker died (killed, out of memory): the next export gets fresh ones
            log.error("an OTLP decoding worker died; starting new ones")
            self.close()
            raise DecoderUnavailable("the export could not be decoded (its worker stopped); send it again") from None
        if decoded.spans is not None:
            return decoded.spans
        if decoded.too_large:
            raise PayloadTooLarge(decoded.error or "export too large", code=decoded.code)
        raise InvalidRequest(decoded.error or "not an OTLP export", code=decoded.code)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


DECODERS = web.AppKey("rlproxy_otlp_decoders", OtlpDecoders)


def decoders_of(settings: IngestSettings):
    """The app's cleanup context that owns its decoders."""

    async def lifecycle(app: web.Application):
        app[DECODERS] = OtlpDecoders(settings)
        try:
            yield
        finally:
            app[DECODERS].close()

    return lifecycle
