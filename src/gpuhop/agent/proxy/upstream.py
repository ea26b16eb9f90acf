"""Runs in the agent: the HTTP/1.1 client of the model-server proxy (`modelserver`), kept lean.

Every predict request through the agent is one request to a model server on this host,
so what this client costs per request is the proxy's cost. httpx (through
httpcore) spent more on its pool than on the request: a poll of every idle connection and
a failed import per request (bench: serving, with py-spy on the agent). This is the least
that the proxy needs: keep-alive connections per port, reused at once; the request
written in one go; the answer parsed by httptools (the agent's own HTTP parser, also
under uvicorn), its body read whole or streamed.

A model server is a job's process, so its answers are parsed as hostile: headers are
bounded, and a connection is reused only after an answer that ended as HTTP says it does.

A server is a port: on this host's loopback, or behind an `Opener` that makes a connection
to it (a job's private network, through its relay). `where` tells apart the connections
to ports of the same number in different places.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable

import httptools

CONNECT_TIMEOUT = 5.0
MAX_HEAD = 64 * 1024  # status line and headers of an answer
MAX_IDLE = 64  # idle connections kept per port
IDLE_SECONDS = 5.0  # an idle connection is closed after this (a model server that ended
# must not leave the agent holding its connections until its port is used again)
READ = 64 * 1024

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]
# Makes a new connection to a server not on this host's loopback; raises UpstreamError.
Opener = Callable[[], Awaitable[Streams]]
# Where a server's kept connections are: (`where`, port).
Key = tuple[str, int]


class UpstreamError(Exception):
    """The model server could not be reached, or its answer was not HTTP."""


class UpstreamTimeout(UpstreamError):
    pass


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer
        self.expiry: asyncio.TimerHandle | None = None

    def usable(self) -> bool:
        """Whether an idle connection may carry another request (the server has not closed
        it meanwhile, as one does after its keep-alive timeout)."""
        return not self.reader.at_eof() and not self.writer.is_closing()

    def close(self) -> None:
        self.writer.close()


class Answer:
    """A model server's answer: status and headers read; the body to read or stream."""

    def __init__(self, pool: Pool, key: Key, conn: _Connection, parser: _Parser):
        self.status = parser.status
        self.headers = parser.headers
        self._pool, self._key, self._conn, self._parser = pool, key, conn, parser

    @property
    def length(self) -> int | None:
        value = self.headers.get("content-length")
        return int(value) if value is not None and value.isdigit() else None

    async def read(self, timeout: float) -> bytes:
        return b"".join([chunk async for chunk in self.stream(timeout)])

    async def stream(self, timeout: float) -> AsyncIterator[bytes]:
        """The body's chunks as they come; then the connection goes back to the pool (if
        the answer ended cleanly and the server keeps it alive) or is closed."""
        parser = self._parser
        try:
            while True:
                if parser.body:
                    chunk, parser.body = b"".join(parser.body), []
                    yield chunk
                if parser.complete:
                    break
                data = await _read(self._conn, timeout)
                if not data:
                    parser.eof()
                    continue
                parser.feed(data)
        finally:
            self.release()

    def release(self) -> None:
        """Done with the answer: keep the connection for the next request, or close it."""
        conn, self._conn = self._conn, None  # type: ignore[assignment]
        if conn is None:
            return
        if self._parser.complete and self._parser.keep_alive and conn.usable():
            self._pool.put(self._key, conn)
        else:
            conn.close()


class Pool:
    """Keep-alive connections to model servers, by where they are and port."""

    def __init__(self) -> None:
        self._idle: dict[Key, list[_Connection]] = {}

    async def send(
        self,
        port: int,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes | None,
        timeout: float,
        where: str = "",
        opener: Opener | None = None,
    ) -> Answer:
        """Send one request and read its answer's status and headers. A kept connection
        that the server closed before answering is retried once on a fresh one. Without
        `opener` the server is `port` on this host's loopback; with it, `opener` makes each
        new connection, and `where` (say, a job's id) keeps them apart from others'."""
        key = (where, port)
        lines = [f"{method} {target} HTTP/1.1", f"host: 127.0.0.1:{port}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if body is not None:
            lines.append(f"content-length: {len(body)}")
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
        while True:
            conn, reused = self._take(key), True
            if conn is None:
                conn, reused = await self._connect(port, opener), False
            parser = _Parser()
            try:
                conn.writer.write(request)
                while not parser.headers_done:
                    data = await _read(conn, timeout)
                    if not data:
                        if reused and not parser.started:
                            raise _Stale
                        raise UpstreamError("the model server closed the connection")
                    parser.feed(data)
            except _Stale:
                conn.close()
                continue
            except BaseException:
                conn.close()
                raise
            return Answer(self, key, conn, parser)

    def _take(self, key: Key) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.expiry is not None:
                conn.expiry.cancel()
                conn.expiry = None
            if conn.usable():
                return conn
            conn.close()
        return None

    def put(self, key: Key, conn: _Connection) -> None:
        idle = self._idle.setdefault(key, [])
        if len(idle) >= MAX_IDLE:
            conn.close()
        else:
            idle.append(conn)
            loop = asyncio.get_running_loop()
            conn.expiry = loop.call_later(IDLE_SECONDS, self._expire, key, conn)

    def _expire(self, key: Key, conn: _Connection) -> None:
        idle = self._idle.get(key, [])
        if conn in idle:
            idle.remove(conn)
            if not idle:
                del self._idle[key]
        conn.expiry = None
        conn.close()

    async def _connect(self, port: int, opener: Opener | None) -> _Connection:
        if opener is not None:
            return _Connection(*await opener())
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", port, limit=READ), CONNECT_TIMEOUT
            )
        except TimeoutError:
            raise UpstreamTimeout(f"no connection within {CONNECT_TIMEOUT:g}s") from None
        except OSError as e:
            why = os.strerror(e.errno) if e.errno else str(e)
            raise UpstreamError(f"cannot connect to 127.0.0.1:{port} ({why})") from None
        return _Connection(reader, writer)

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                if conn.expiry is not None:
                    conn.expiry.cancel()
                conn.close()
        self._idle.clear()


class _Stale(Exception):
    pass


async def _read(conn: _Connection, timeout: float) -> bytes:
    try:
        return await asyncio.wait_for(conn.reader.read(READ), timeout)
    except TimeoutError:
        raise UpstreamTimeout(f"no answer within {timeout:g}s") from None
    except OSError as e:
        raise UpstreamError(e.strerror or str(e)) from None


class _Parser:
    """httptools' response parser, and what it found."""

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.started = self.headers_done = self.complete = self.keep_alive = False
        self._head = 0

    def feed(self, data: bytes) -> None:
        self.started = True
        if not self.headers_done:
            self._head += len(data)
            if self._head > MAX_HEAD + READ:
                raise UpstreamError(f"the answer's headers are larger than {MAX_HEAD} bytes")
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as e:
            raise UpstreamError(f"the answer is not HTTP ({e})") from None

    def eof(self) -> None:
        """The server closed the connection: the end of a body that has neither a length
        nor chunks (HTTP/1.0 style), else a broken answer."""
        framed = "content-length" in self.headers or "chunked" in self.headers.get(
            "transfer-encoding", ""
        )
        if framed or not self.headers_done:
            raise UpstreamError("the model server closed the connection mid-answer")
        self.complete, self.keep_alive = True, False

    # httptools' callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        # Asked now: once the message is complete, the parser forgets.
        self.keep_alive = bool(self._parser.should_keep_alive())
        self.complete = True
