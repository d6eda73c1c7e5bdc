"""How much of a request body the proxy reads, and when: nothing before the caller is known and the declared size
is allowed, and no more than the bounds allow after.

- `Expect: 100-continue` is answered only once the key, the rate and the declared `Content-Length` have passed
  (`continue_upload`, called by the limits middleware). aiohttp would answer it before any middleware runs, so
  every route is registered with `expect_later`, which leaves the answer to that call.
- A compressed body (`Content-Encoding: gzip` or `deflate`) is inflated here, not by aiohttp (the application is
  built with `auto_decompress=False`), in a worker thread, in steps of `STEP` bytes: refused with 413 as soon as
  it passes `--max-inflated-size` or `--max-inflation-ratio` times the compressed bytes read, and nothing more of
  it is read then. Any other encoding is 415. Every later `request.read()`, whichever module calls it, returns the inflated
  bytes that passed.
- A body must arrive within `--body-timeout` seconds of its request's head (`body_deadline`): past it, whatever
  is reading it gets 408 and the connection is closed, so a slow sender holds neither a connection nor the part
  of a body it sent. A slow head is bounded by aiohttp (`keepalive_timeout`, the proxy's `--header-timeout`).
- A request refused before its body was read to the end (401, 403, 413, 415, 429, …) is answered with
  `Connection: close` and the connection is closed, instead of reading and discarding the rest (`close_refused`;
  the application's `lingering_time` is 0, so aiohttp does not drain it either).
"""
from __future__ import annotations

import asyncio
import zlib
from dataclasses import dataclass

from aiohttp import web

from proxy.errors import (ExpectationFailed, InvalidRequest, NotImplementedCoding, PayloadTooLarge, RequestTimeout,
                          Unprocessable, UnsupportedMediaType)

REFUSED_CODING = "rlproxy_refused_transfer_coding"  # set on a request whose transfer coding was refused
STEP = 64 * 1024
"""Most bytes one inflate step produces: a bomb is caught within one step of passing a bound."""

RATIO_FLOOR = 1024 * 1024
"""Inflated bytes below which the ratio is not checked: small bodies (a short JSON document) compress far better
than large ones, and inflating them costs nothing."""

MAX_MEMBERS = 64
"""gzip members one body may hold (RFC 1952 lets a file be several concatenated): each starts a new inflater."""

GZIP = 16 + zlib.MAX_WBITS
ZLIB = zlib.MAX_WBITS
RAW_DEFLATE = -zlib.MAX_WBITS
ENCODINGS = {"gzip": GZIP, "x-gzip": GZIP, "deflate": ZLIB}
IDENTITY = {"", "identity"}

UNREADABLE_BODY = web.AppKey("rlproxy_unreadable_body_status", dict)
"""Each route's status for a body that cannot be read (400, or 422 on the routes that answer malformed bodies
with 422), filled by `proxy.api.register`."""

SERVER_SETTINGS = {"auto_decompress": False, "lingering_time": 0}
"""aiohttp server settings these rules need (`web.Application(handler_args=...)`)."""


@dataclass(frozen=True, slots=True)
class InflateBounds:
    max_size: int  # inflated bytes
    max_ratio: float  # inflated bytes per compressed byte, past RATIO_FLOOR


class Inflater:
    """Inflates one body fed piece by piece; raises PayloadTooLarge the moment a bound is passed and
    InvalidRequest for data that is not what its encoding says."""

    def __init__(self, encoding: str, bounds: InflateBounds) -> None:
        self.encoding = encoding
        self.bounds = bounds
        self.compressed = 0  # bytes fed so far
        self.size = 0  # bytes inflated so far
        self.members = 0
        self._inflater: zlib._Decompress | None = None
        self._parts: list[bytes] = []

    def feed(self, data: bytes) -> None:
        self.compressed += len(data)
        pending = data
        while pending or self._inflater is not None and not self._inflater.eof:
            if self._inflater is None or self._inflater.eof:
                self._start_member(pending)
            try:
                out = self._inflater.decompress(pending, STEP)
            except zlib.error as exc:
                raise self._invalid(exc) from None
            pending = self._inflater.unconsumed_tail
            self._take(out, unread=len(pending))
            if self._inflater.eof:
                pending = self._inflater.unused_data + pending
            elif not pending and len(out) < STEP:  # all input taken and all its output given: wait for more
                break

    def finish(self) -> bytes:
        if self._inflater is None:
            if self.compressed:
                raise self._invalid("no data")
            return b""
        if not self._inflater.eof:
            raise self._invalid("the body ends before its compressed stream does")
        body = b"".join(self._parts)
        self._parts.clear()
        return body

    def _start_member(self, data: bytes) -> None:
        self.members += 1
        if self.members > MAX_MEMBERS:
            raise InvalidRequest(f"compressed request body holds more than {MAX_MEMBERS} gzip members",
                                 code="invalid_body")
        wbits = ENCODINGS[self.encoding]
        if wbits == ZLIB and data[0] & 0x0F != 8:  # RFC 1950 says zlib; some clients send raw deflate
            wbits = RAW_DEFLATE
        self._inflater = zlib.decompressobj(wbits)

    def _take(self, out: bytes, unread: int) -> None:
        self.size += len(out)
        if self.size > self.bounds.max_size:
            raise PayloadTooLarge(f"the request body inflates to more than the {self.bounds.max_size} bytes this "
                                  f"proxy accepts from a compressed body", code="inflated_body_too_large")
        consumed = self.compressed - unread
        if self.size > RATIO_FLOOR and self.size > self.bounds.max_ratio * max(consumed, 1):
            raise PayloadTooLarge(f"the request body inflates more than {self.bounds.max_ratio:g} times its "
                                  f"compressed size, more than this proxy accepts", code="inflation_ratio_too_high")
        if out:
            self._parts.append(out)

    def _invalid(self, why: object) -> InvalidRequest:
        return InvalidRequest(f"the request body is not valid {self.encoding} data: {why}", code="invalid_body")


def body_encoding(request: web.Request) -> str | None:
    """The body's content coding, None for none; 415 for one the proxy does not inflate (also for several,
    `gzip, gzip`, which only a bomb needs)."""
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding in IDENTITY:
        return None
    if encoding not in ENCODINGS:
        raise UnsupportedMediaType(f"Content-Encoding {encoding!r} is not accepted: send the body as it is, or "
                                   f"with {', '.join(sorted(ENCODINGS))}", code="unsupported_content_encoding")
    return encoding


def check_transfer_coding(request: web.Request) -> None:
    """501 for a transfer coding other than `chunked` alone (RFC 9112: a server answers one it does not implement
    with 501). aiohttp reads `gzip, chunked` as if it were `chunked`, so the route would read gzip bytes as the
    body; a front proxy that decodes them would see another body than this one."""
    codings = [c.strip().lower() for value in request.headers.getall("Transfer-Encoding", ())
               for c in value.split(",") if c.strip()]
    if codings and codings != ["chunked"]:
        request[REFUSED_CODING] = True  # close_refused closes the connection
        raise NotImplementedCoding(f"Transfer-Encoding {', '.join(codings)!r} is not implemented: send the body "
                                   "chunked or with a Content-Length, compressed if at all with Content-Encoding "
                                   f"({', '.join(sorted(ENCODINGS))})")


async def inflate_body(request: web.Request, bounds: InflateBounds, max_compressed: int) -> None:
    """Read a compressed body and inflate it within `bounds`, then leave the result where `request.read()` finds
    it. A body without a content coding is left for the route to read."""
    if not request.body_exists or (encoding := body_encoding(request)) is None:
        return
    inflater = Inflater(encoding, bounds)
    try:
        async for chunk in request.content.iter_any():  # at most aiohttp's read buffer at a time
            if inflater.compressed + len(chunk) > max_compressed:
                raise PayloadTooLarge(f"request body is larger than the {max_compressed} bytes this proxy accepts")
            await asyncio.to_thread(inflater.feed, chunk)  # zlib lets go of the GIL: other requests go on meanwhile
        # aiohttp keeps a body it has read in `_read_bytes`, and every later `read()` returns it: setting it makes
        # every reader of this request, in whichever module, read the inflated bytes that passed the bounds.
        request._read_bytes = inflater.finish()
    except InvalidRequest as exc:  # not what its encoding says: in the route's own status for a malformed body
        if request.app.get(UNREADABLE_BODY, {}).get(request.match_info.route) == 422:
            raise Unprocessable(exc.message, code=exc.code) from None
        raise


async def read_within(request: web.Request, limit: int) -> bytes | None:
    """The body, or None as soon as it passes `limit` bytes: a chunked body (no declared length) is not read to
    the proxy's whole --client-max-size before a small route's own bound refuses it; the rest stays unread and
    the refusal closes the connection (`close_refused`). A body `inflate_body` left is taken as it is."""
    if request._read_bytes is not None:
        return request._read_bytes if len(request._read_bytes) <= limit else None
    chunks, size = [], 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    request._read_bytes = b"".join(chunks)  # where a later `request.read()` finds it
    return request._read_bytes


async def continue_upload(request: web.Request) -> None:
    """Answer `Expect: 100-continue` now that the request may send its body; 417 for any other expectation."""
    expect = request.headers.get("Expect")
    if expect is None or request.match_info.http_exception is not None:  # no route takes it: its 404/405 answers
        return
    if expect.strip().lower() != "100-continue":
        raise ExpectationFailed(f"unknown expectation {expect!r}: only 100-continue is understood")
    if request.version >= (1, 1) and request.body_exists and not request.content.is_eof():
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # what the access log counts is the answer, not this line


async def expect_later(request: web.Request) -> None:
    """Every route's expect handler: aiohttp calls it before the middlewares; it sends nothing, so no body is
    invited before the caller is known (`continue_upload` answers, or the refusal does)."""
    return None


@web.middleware
async def close_refused(request: web.Request, handler):
    """The outermost middleware: an error answered before the body was read closes the connection, so the rest
    of the body is neither read nor waited for; so does a refused transfer coding, whose framing is in doubt
    (where this request ends is not agreed on, so nothing after it on the connection is read)."""
    response = await handler(request)
    unread = request.body_exists and not request.content.is_eof()
    if response.status >= 400 and unread or request.get(REFUSED_CODING):
        response.force_close()
    return response


def body_deadline(seconds: float):
    """A middleware: the body of each request must have arrived `seconds` after its head did, or its reader gets
    RequestTimeout (408); `close_refused` then closes the connection."""

    @web.middleware
    async def deadline(request: web.Request, handler):
        if not request.body_exists or request.content.is_eof():
            return await handler(request)
        timer = asyncio.get_running_loop().call_later(seconds, _overdue, request, seconds)
        try:
            return await handler(request)
        finally:
            timer.cancel()

    return deadline


def _overdue(request: web.Request, seconds: float) -> None:
    if not request.content.is_eof():  # wakes a reader waiting for more, and fails every later read
        request.content.set_exception(RequestTimeout(
            f"the request body did not arrive within {seconds:g} seconds of its head (--body-timeout)"))
