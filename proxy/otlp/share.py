"""Each project's share of the OTLP decoders. The decoders are few (`--otlp-decoders`, 1 by default) and an export
near the span budget takes them about a second, so without shares one project keeping such exports in flight
held every other project's exports in one first-come queue past the OpenTelemetry exporter's 10 s timeout, and
their rewards were lost (the exporter gives up). Two rules bound it:

- **Bytes in flight per project** (`--otlp-project-bytes`): what one project (one key's project; the operator's
  key and a proxy without keys are a project of their own) has waiting for or in the decoders. An export past it
  is refused with 429 and `Retry-After` before its body is read, so the refusal costs a header's worth of work;
  OTLP/HTTP exporters retry a 429 after `Retry-After`. A project with nothing in flight is always let in,
  however large its export, so no export within the body limit is refused for good.
- **Turns taken in rotation**: the decoders are handed out one export at a time, project after project, never
  more at once than there are decoders, so an export waits for at most one export of each other project ahead
  of it (and those already being decoded), not for everything another project sent first.

The 429's body is OTLP's own: a `google.rpc.Status` in the request's encoding, with a `RetryInfo` detail."""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web
from google.protobuf import any_pb2, duration_pb2

from proxy.errors import RateLimited, json_response
from proxy.otlp.export import PROTOBUF_TYPES

RETRY_AFTER = 1
"""Seconds a refused exporter is told to wait. The OpenTelemetry SDK waits exactly this long (no jitter) and gives
up once the wait would pass its 10 s deadline, so a short wait leaves it room for several tries; a decode takes
about a second at worst, so a second usually frees the project's share."""


class DecodersBusy(RateLimited):
    """429: the project already has its share of the decoders in flight; answered as OTLP answers errors."""

    default_code = "otlp_project_busy"

    def __init__(self, message: str, *, content_type: str) -> None:
        super().__init__(message, retry_after=RETRY_AFTER)
        self.content_type = content_type

    def response(self) -> web.Response:
        # OTLP/HTTP: the body of a 4xx is a google.rpc.Status in the request's encoding (exporters log its message)
        if self.content_type in PROTOBUF_TYPES:
            return web.Response(status=self.status, body=status_message(self.message, RETRY_AFTER),
                                content_type=self.content_type, headers=self.headers)
        return json_response({"code": RESOURCE_EXHAUSTED, "message": self.message,
                              "details": [{"@type": RETRY_INFO, "retryDelay": f"{RETRY_AFTER}s"}]},
                             status=self.status, headers=self.headers)


RESOURCE_EXHAUSTED = 8  # google.rpc.Code: what a 429 is in gRPC's codes
RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"


def status_message(message: str, retry_after: int) -> bytes:
    """google.rpc.Status {code, message, details: [RetryInfo {retry_delay}]} on the wire. Written field by field:
    its generated classes come with googleapis-common-protos, which the proxy does not otherwise need; Any and
    Duration are protobuf's own."""
    retry_info = _field(1, duration_pb2.Duration(seconds=retry_after).SerializeToString())  # RetryInfo.retry_delay
    detail = any_pb2.Any(type_url=RETRY_INFO, value=retry_info).SerializeToString()
    return bytes([1 << 3]) + _varint(RESOURCE_EXHAUSTED) + _field(2, message.encode()) + _field(3, detail)


def _field(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data  # wire type 2: length-delimited


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@dataclass(slots=True)
class Share:
    """One export's place in its project's share: its bytes count until it is decoded (or refused)."""

    shares: ProjectShares
    project: str | None
    size: int
    done: bool = False

    def resize(self, size: int) -> None:
        """The body's real size once read (an export of unknown length was charged the whole share)."""
        if not self.done:
            size = max(size, 1)  # as admitted: an empty export still counts
            self.shares.bytes_in_flight[self.project] += size - self.size
            self.size = size

    def release(self) -> None:
        if self.done:
            return
        self.done = True
        if self.shares.exports_in_flight[self.project] == 1:  # the project's last: forget it (projects come and go)
            del self.shares.bytes_in_flight[self.project], self.shares.exports_in_flight[self.project]
        else:
            self.shares.bytes_in_flight[self.project] -= self.size
            self.shares.exports_in_flight[self.project] -= 1

    def __enter__(self) -> Share:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class ProjectShares:
    def __init__(self, max_bytes: int, decoders: int) -> None:
        self.max_bytes = max_bytes
        self.bytes_in_flight: dict[str | None, int] = {}
        self.exports_in_flight: dict[str | None, int] = {}
        self.free = decoders
        # Projects waiting for a decoder, in the order their turns come, each with its exports' wake-ups in the
        # order they asked: a dict keeps insertion order, so taking the first project and putting it back last
        # is the rotation.
        self.waiting: dict[str | None, deque[asyncio.Future[None]]] = {}

    def admit(self, project: str | None, size: int | None, content_type: str) -> Share:
        """A place for an export of `size` bytes (None: not known before reading, charged the whole share), or
        DecodersBusy when the project's exports in flight would pass its share."""
        charged = self.max_bytes if size is None else max(size, 1)  # an empty export takes a turn all the same
        held = self.bytes_in_flight.get(project, 0)
        if held and held + charged > self.max_bytes:
            raise DecodersBusy(f"this project has {held} bytes of OTLP exports waiting for or in the decoders; "
                               f"it may have {self.max_bytes} (--otlp-project-bytes): retry in {RETRY_AFTER}s",
                               content_type=content_type)
        self.bytes_in_flight[project] = held + charged
        self.exports_in_flight[project] = self.exports_in_flight.get(project, 0) + 1
        return Share(self, project, charged)

    @asynccontextmanager
    async def turn(self, project: str | None) -> AsyncIterator[None]:
        """A decoder for one export, once the projects ahead in the rotation have had theirs."""
        if self.free and not self.waiting:
            self.free -= 1
        else:
            woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.waiting.setdefault(project, deque()).append(woken)
            try:
                await woken
            except asyncio.CancelledError:
                if woken.done() and not woken.cancelled():  # given the decoder just as it was cancelled
                    self._hand_on()
                else:
                    self._forget(project, woken)
                raise
        try:
            yield
        finally:
            self._hand_on()

    def _hand_on(self) -> None:
        """A decoder is free: to the next project in the rotation, else back to the free ones."""
        while self.waiting:
            project = next(iter(self.waiting))
            queue = self.waiting.pop(project)
            woken = queue.popleft()
            if queue:
                self.waiting[project] = queue  # its next export waits for every other project's turn
            if not woken.done():
                woken.set_result(None)
                return
        self.free += 1

    def _forget(self, project: str | None, woken: asyncio.Future[None]) -> None:
        queue = self.waiting.get(project)
        if queue is not None and woken in queue:
            queue.remove(woken)
            if not queue:
                del self.waiting[project]
