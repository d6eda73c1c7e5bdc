"""A TCP relay between the proxy and the engine that records each connection, so a test can see from outside
when the proxy lets go of an engine request."""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

from tests.support import pump


@dataclass
class Link:
    request: bytes = b""  # the first bytes the proxy sent
    received: int = 0  # bytes the engine sent back
    closed_at: float | None = None


@dataclass
class Relay:
    target_port: int
    port: int = 0
    links: list[Link] = field(default_factory=list)

    def __enter__(self) -> "Relay":
        self._loop = asyncio.new_event_loop()
        started = threading.Event()

        async def serve() -> None:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            self.port = self._server.sockets[0].getsockname()[1]
            started.set()

        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(serve(), self._loop)
        started.wait(5)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def streams(self) -> list[Link]:
        """The links that carried a streamed completion."""
        return [link for link in self.links if b'"stream":true' in link.request.replace(b" ", b"")]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = Link()
        self.links.append(link)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)

        def sent(data: bytes) -> None:
            if len(link.request) < 4096:
                link.request += data

        def received(data: bytes) -> None:
            link.received += len(data)

        await asyncio.gather(pump(reader, up_writer, sent), pump(up_reader, writer, received))
        link.closed_at = time.monotonic()
