"""Runs in the agent: the listeners' HTTP protocol, uvicorn's httptools one with a cheaper
body path (`BodyHttpProtocol`, both listeners) and, on the TCP listener, bounds.

uvicorn bounds none of a request's head with httptools (its `h11_max_incomplete_event_size`
is for h11 only): a client could send headers for ever, each buffered, before any token is
checked. Here a request head (request line and headers) is refused with 431 once it passes
`MAX_HEAD_BYTES` or `MAX_HEADERS`, and a connection is closed when a head takes longer than
`HEAD_TIMEOUT` to arrive, counted from the connection's start or from the first byte of a
request after a keep-alive pause (a client sending a byte at a time gains nothing). A body
must then keep coming: in each `BODY_WINDOW` while it is awaited, at least `MIN_BODY_RATE`
bytes a second on average, or the request is answered 408 and the connection closed. Windows
in which the agent itself stopped reading (its buffer full, the route busy) do not count.
uvicorn's own `timeout_keep_alive` closes connections idle between requests.

An answer's head is written with its first body message (`_HeldHead`) when that message
follows at once, as it does for every answer of known length: uvicorn writes them apart, and
the first write wakes the client only for it to wait for the second. A head whose body does
not follow in the same turn of the event loop (a stream that waits for its first chunk) is
written then, alone, as before.

`on_lost`, given by the listener's accept loop (`gpuhop.agent.server.accept`), is called once when
the connection ends, also after an upgrade to a WebSocket (whose protocol then owns it).

The WebSocket protocol (`DenialWebSockets`, both listeners) is uvicorn's own but for one
line: a handshake refused with an HTTP answer counts as complete.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httptools
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 100
HEAD_TIMEOUT = 10.0
KEEP_ALIVE_TIMEOUT = 5
REFUSAL_GRACE = 1.0
BODY_WINDOW = 10.0
MIN_BODY_RATE = 1024  # bytes a second, averaged over a window

_431 = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\n"
    b"connection: close\r\n\r\n%s"
)
_408 = _431.replace(b"431 Request Header Fields Too Large", b"408 Request Timeout")


class _HeadTooLarge(Exception):
    """Raised in a parser callback: the request head passed a bound."""


class _Pieces:
    """A request body's pieces as they arrived, in uvicorn's place for its bytearray.

    uvicorn copies every piece into a bytearray (`cycle.body += body`) and that into new
    bytes when the app receives it (`bytes(cycle.body)`): two copies of every byte of an
    upload on the event loop, and a buffer grown by reallocation. Kept as a list, the app
    gets the one piece that arrived as it is (`b"".join` of one bytes object is that
    object), or the pieces joined: one copy at most."""

    __slots__ = ("pieces", "size")

    def __init__(self) -> None:
        self.pieces: list[bytes] = []
        self.size = 0

    def add(self, piece: bytes) -> None:
        self.pieces.append(piece)
        self.size += len(piece)

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        return b"".join(self.pieces)


class _HeldHead:
    """A request cycle's transport, holding the answer's head until the next write.

    uvicorn's cycle writes the head (status line and headers) when the app starts its
    answer and each body message as it comes. The head is held here and written with the
    next write, in one `writelines`, or alone at the end of the event loop's turn if none
    comes meanwhile; a close writes it first. Everything else is the transport's own."""

    __slots__ = ("_cycle", "_flush", "_held", "_transport")

    def __init__(self, transport: asyncio.Transport, cycle: Any):
        self._transport = transport
        self._cycle = cycle  # its `response_started` tells the head from a 100 Continue
        self._held: bytes | None = None
        self._flush: asyncio.Handle | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._release()
            self._transport.writelines((held, data))
        elif self._flush is None and self._cycle.response_started:
            self._held = data  # the head: uvicorn writes it first once the answer starts
            self._flush = asyncio.get_running_loop().call_soon(self.flush)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        held = self._held
        if held is not None:
            self._release()
            self._transport.write(held)

    def _release(self) -> None:
        self._held = None
        assert self._flush is not None
        self._flush.cancel()  # the handle stays: one head a cycle

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class BodyHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with a request body kept as its pieces (`_Pieces`) and
    an answer's head written with its body (`_HeldHead`)."""

    def on_headers_complete(self) -> None:
        before = self.cycle
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not before and cycle is not None and cycle.transport is self.transport:
            cycle.transport = _HeldHead(self.transport, cycle)  # type: ignore[assignment]

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if (self.parser.should_upgrade() and self._should_upgrade()) or cycle.response_complete:
            return
        current: object = cycle.body
        if isinstance(current, _Pieces):
            pieces = current
        elif isinstance(current, bytearray) and not current:
            # uvicorn puts a new bytearray there after each receive: ours instead.
            pieces = _Pieces()
            cycle.body = pieces  # type: ignore[assignment]  # uvicorn reads bytes(body)
        else:
            # An older uvicorn, which hands `cycle.body` itself to the app: its own way.
            super().on_body(body)
            return
        pieces.add(body)
        if pieces.size > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        cycle.message_event.set()


class BoundedHttpProtocol(BodyHttpProtocol):
    def __init__(self, *args: Any, on_lost: Callable[[], None] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._on_lost = on_lost
        # Bytes of the current request head seen so far; None while a body or an answer is
        # under way (between the end of one head and the end of its request).
        self._head_bytes: int | None = 0
        self._head_count = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False
        self._too_large_seen = False
        # While a request's body is awaited: bytes of it in this window, and whether the
        # agent paused reading in it (then the client is not to blame for a slow window).
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_bytes = 0
        self._body_excused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        self._disarm_body_timer()
        try:
            super().connection_lost(exc)
        finally:
            self._release()

    def data_received(self, data: bytes) -> None:
        # uvicorn's own, with the head's bounds: bytes are counted until the head's end.
        if self._refused:
            return
        self._unset_keepalive_if_required()
        if self._head_bytes is not None:
            if self._head_timer is None:
                self._arm_head_timer()  # the first bytes of a request after a keep-alive pause
            self._head_bytes += len(data)
        elif self._body_timer is not None:
            self._body_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError:
            if self._too_large_seen:
                self._refuse_head()
                return
            message = "Invalid HTTP request received."
            self.logger.warning(message)
            self.send_400_response(message)
            return
        if self._head_bytes is not None and self._head_bytes > MAX_HEAD_BYTES:
            self._refuse_head()  # no end of the head yet, and past the bound
        if self._body_timer is not None and self.flow.read_paused:
            self._body_excused = True

    def handle_websocket_upgrade(self) -> None:
        self._disarm_head_timer()
        self._disarm_body_timer()
        self._head_bytes = None
        super().handle_websocket_upgrade()
        upgraded = self.transport.get_protocol()
        if upgraded is not self and self._on_lost is not None:
            release = self._release
            their_lost = upgraded.connection_lost

            def connection_lost(exc: Exception | None) -> None:
                try:
                    their_lost(exc)
                finally:
                    release()

            upgraded.connection_lost = connection_lost  # type: ignore[method-assign]

    # Parser callbacks
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_count = 0

    def on_url(self, url: bytes) -> None:
        if len(self.url) + len(url) > MAX_HEAD_BYTES:
            self._too_large()
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_count += 1
        if self._head_count > MAX_HEADERS:
            self._too_large()
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._disarm_head_timer()
        self._head_bytes = None
        super().on_headers_complete()
        self._arm_body_timer()  # disarmed at once if the request has no body

    def on_message_complete(self) -> None:
        self._disarm_body_timer()
        super().on_message_complete()
        self._head_bytes = 0

    def _too_large(self) -> None:
        # httptools turns this into an HttpParserCallbackError out of feed_data.
        self._too_large_seen = True
        raise _HeadTooLarge

    def _refuse_head(self) -> None:
        self._refused = True
        self._disarm_head_timer()
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete:
            message = (
                f"the request's headers are too large (at most {MAX_HEAD_BYTES} bytes"
                f" and {MAX_HEADERS} headers)"
            ).encode()
            self.transport.write(_431 % (len(message), message))
        self.transport.close()
        # A TLS close waits for the client's close_notify, reading (and dropping) what it
        # still sends meanwhile: a client that sends on gets the connection aborted.
        transport = self.transport
        self.loop.call_later(REFUSAL_GRACE, transport.abort)

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        self._head_timer = self.loop.call_later(HEAD_TIMEOUT, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def _arm_body_timer(self) -> None:
        self._disarm_body_timer()
        self._body_bytes = 0
        self._body_excused = self.flow.read_paused
        self._body_timer = self.loop.call_later(BODY_WINDOW, self._body_window_ended)

    def _disarm_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_window_ended(self) -> None:
        self._body_timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        # A client that asked to be told to go on (Expect: 100-continue) waits for the route.
        waiting = cycle is not None and cycle.waiting_for_100_continue
        if self._body_excused or waiting or self._body_bytes >= MIN_BODY_RATE * BODY_WINDOW:
            self._arm_body_timer()
            return
        self._refused = True
        # uvicorn's logger: throttled as a flood's lines are (see gpuhop.agent.server.logs).
        self.logger.warning(
            "closed a connection from %s: its request body came at under %d bytes a second",
            self.client[0] if self.client else "?",
            MIN_BODY_RATE,
        )
        if cycle is not None and not cycle.response_started:
            # The route waiting on the body gets a disconnect, and anything it answers is
            # dropped: the 408 is the answer.
            cycle.disconnected = True
            cycle.message_event.set()
            message = (
                f"the request body arrived too slowly (under {MIN_BODY_RATE} bytes a second"
                f" over {BODY_WINDOW:.0f} s); the connection is closed"
            ).encode()
            self.transport.write(_408 % (len(message), message))
        self.transport.close()
        transport = self.transport
        self.loop.call_later(REFUSAL_GRACE, transport.abort)

    def _release(self) -> None:
        on_lost, self._on_lost = self._on_lost, None
        if on_lost is not None:
            on_lost()


class DenialWebSockets(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol (websockets' sans-I/O one), where a handshake refused
    with an HTTP answer (the `websocket.http.response` extension: our 401, 403 and 404 with
    their JSON bodies) is complete once that answer is sent.

    uvicorn (0.54) leaves it incomplete and logs "ASGI callable returned without completing
    handshake." at ERROR for every such refusal, though the client got its answer
    (Kludex/uvicorn#3138; its wsproto protocol marks it). Goes once uvicorn does the same.
    """

    async def send(self, message: Any) -> None:
        await super().send(message)
        if message["type"] == "websocket.http.response.body" and not message.get("more_body"):
            self.handshake_complete = True
