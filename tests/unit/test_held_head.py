"""An answer's head written with its first body message (agent.server.protocol._HeldHead),
on a real socket pair with asyncio's own transport: what the peer can read after each write."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from types import SimpleNamespace

from gpuhop.agent.server.protocol import _HeldHead

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"


def pending(peer: socket.socket) -> bytes:
    """What the peer can read now, without waiting."""
    try:
        return peer.recv(65536)
    except BlockingIOError:
        return b""


def on_pair(check: Callable[[_HeldHead, SimpleNamespace, socket.socket], Awaitable[None]]) -> None:
    """Run `check` with a held-head transport over one end of a socket pair, the peer the
    other end (non-blocking); both are closed afterwards, also when the check fails."""

    async def main() -> None:
        ours, peer = socket.socketpair()
        peer.setblocking(False)
        with peer:
            transport, _ = await asyncio.get_running_loop().connect_accepted_socket(
                asyncio.Protocol, ours
            )
            try:
                cycle = SimpleNamespace(response_started=False)
                await check(_HeldHead(transport, cycle), cycle, peer)  # type: ignore[arg-type]
            finally:
                transport.close()
                await asyncio.sleep(0)  # the transport's close runs its course

    asyncio.run(main())


def test_the_head_goes_out_with_the_first_body_message_in_one_write() -> None:
    async def check(held: _HeldHead, cycle: SimpleNamespace, peer: socket.socket) -> None:
        held.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # before the answer starts: at once
        assert pending(peer) == b"HTTP/1.1 100 Continue\r\n\r\n"
        cycle.response_started = True
        held.write(HEAD)
        assert pending(peer) == b""  # held
        held.write(b"hello")
        assert pending(peer) == HEAD + b"hello"
        await asyncio.sleep(0)  # the turn's end finds nothing held
        held.write(b"more")  # a later message: at once
        assert pending(peer) == b"more"

    on_pair(check)


def test_a_head_whose_body_waits_goes_out_alone_at_the_turns_end() -> None:
    async def check(held: _HeldHead, cycle: SimpleNamespace, peer: socket.socket) -> None:
        cycle.response_started = True
        held.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        assert pending(peer) == b""
        await asyncio.sleep(0)  # a stream waiting for its first chunk
        assert pending(peer) == b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        held.write(b"5\r\nhello\r\n")
        assert pending(peer) == b"5\r\nhello\r\n"

    on_pair(check)


def test_a_close_writes_the_held_head_first() -> None:
    async def check(held: _HeldHead, cycle: SimpleNamespace, peer: socket.socket) -> None:
        cycle.response_started = True
        held.write(HEAD)
        held.close()  # uvicorn's, when the app fails after starting its answer
        assert pending(peer) == HEAD
        assert held.is_closing()  # the transport's own, through the holder

    on_pair(check)
