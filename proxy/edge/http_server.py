"""What aiohttp's HTTP server does before any route or middleware runs, held to the proxy's rules.

- A request aiohttp cannot parse (a bad request line, bare-LF line endings, an invalid header) is answered by
  aiohttp itself, with the parse error's message as the body — and that message quotes the raw bytes of the
  request's head, `Authorization` header included. `GuardedRequestHandler` answers such a request in the
  OpenAI error shape with only the kind of error, never a byte of the request (and closes the connection, as
  aiohttp does). What aiohttp logs of it is redacted by core/log_redaction.py.
- A path the proxy does not route (404) or a method it does not take there (405) gets, from aiohttp's router, its
  default `Expect` handler, which invites the body (`100 Continue`) before any key is checked. `Router` gives
  those requests the same `expect_later` as every routed path: the refusal is the answer, and the body is never
  invited.
- A `Host` header that is not a host name or address with an optional port is 400 before anything else is done
  (`valid_host`): the proxy writes it into the `base_url` it gives a new rollout, where `evil.example/x?` or
  `a@b` would change what the URL points at, and aiohttp fails on some (an empty one, a port past 65535).

aiohttp has no setting for the first two: the request handler class is what its `Server` builds for each connection
(`use_guarded_handler`), and the router is the application's (`web.Application(router=Router())`). Nor has it a
limit on connections held at once: the same handler answers one past `--max-connections` 503 and closes it.
"""
from __future__ import annotations

import re

from aiohttp import web, web_server
from aiohttp.http_exceptions import BadHttpMethod, HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_urldispatcher import MatchInfoError

from proxy.errors import InvalidRequest, ProxyError
from proxy.edge.uploads import expect_later


def too_many_connections(limit: int) -> bytes:
    """The whole answer to a connection past the limit, in the OpenAI error shape (written before any request)."""
    body = (b'{"error":{"message":"the proxy holds its most connections at once (%d, --max-connections); retry",'
            b'"type":"server_error","param":null,"code":"too_many_connections"}}' % limit)
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


LINGER_S = 1.0  # how long a refused connection is read from (and its bytes dropped) before it is closed
NOT_HTTP = ("the request is not valid HTTP/1.1 ({kind}); it was not read, and the connection is closed: send "
            "CRLF line endings, header names without spaces, and headers within the proxy's size limits")


class GuardedRequestHandler(RequestHandler):
    """aiohttp's handler of one connection, but its own error answers carry no request bytes, and a connection past
    `max_connections` is answered 503 and closed before anything of it is read."""

    max_connections = 0  # 0: no limit; set by use_guarded_handler
    busy_answer = b""
    refused = False

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if self.max_connections and len(self._manager._connections) > self.max_connections:
            self.refused = True
            transport.write(self.busy_answer)
            transport.write_eof()
            # Closed a moment later, not now: closing a socket with the client's request unread in its buffer
            # sends a reset, and the client would see that instead of the 503. What it sends meanwhile is dropped.
            self._loop.call_later(LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        if not self.refused:
            super().data_received(data)

    def handle_error(self, request, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if not isinstance(exc, HttpProcessingError):  # a 500 or 504: aiohttp's answer says nothing of the request
            return super().handle_error(request, status, exc, message)
        # as aiohttp logs it: redacted there (core/log_redaction.py); not HTTP at all (TLS, a scanner) only at debug
        log = self.log_debug if isinstance(exc, BadHttpMethod) else self.log_exception
        log("Error handling request from %s", request.remote, exc_info=exc)
        if request.writer.output_size > 0:
            raise ConnectionError("the answer had begun: no error answer can follow")
        error = ProxyError(NOT_HTTP.format(kind=type(exc).__name__ if exc is not None else status),
                           code="malformed_http_request")
        error.status, error.type = status, "invalid_request_error"
        response = error.response()
        response.force_close()
        return response


def use_guarded_handler(max_connections: int = 0) -> None:
    """Make aiohttp's `Server` build a `GuardedRequestHandler` for each connection (it names its handler class
    at module level and takes no argument for it), holding at most `max_connections` at once (0: no limit)."""
    GuardedRequestHandler.max_connections = max_connections
    GuardedRequestHandler.busy_answer = too_many_connections(max_connections)
    web_server.RequestHandler = GuardedRequestHandler


class Unrouted(MatchInfoError):
    """A request no route takes (404 or 405): as aiohttp's, with the proxy's `Expect` handler."""

    @property
    def expect_handler(self):
        return expect_later


class Router(web.UrlDispatcher):
    """aiohttp's router; what it cannot route is `Unrouted`."""

    async def resolve(self, request: web.Request):
        match = await super().resolve(request)
        if isinstance(match, MatchInfoError) and not isinstance(match, Unrouted):
            return Unrouted(match.http_exception)
        return match


_HOST = re.compile(r"^(?:[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\])(?::(\d{1,5}))?$")  # a name, IPv4 or [IPv6], :port


@web.middleware
async def valid_host(request: web.Request, handler):
    """400 for a `Host` header that is not a host and optional port (HTTP/1.0 may send none)."""
    hosts = request.headers.getall("Host", ())
    match = _HOST.match(hosts[0]) if len(hosts) == 1 else None
    if hosts and (match is None or match[1] is not None and int(match[1]) > 65535):
        raise InvalidRequest("the Host header must be one host name or address, with an optional port",
                             param="Host", code="invalid_host")
    return await handler(request)
