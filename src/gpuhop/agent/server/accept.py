"""Runs in the agent: the TCP listener's accept loop, which bounds connections before TLS.

uvicorn hands a listening socket to `loop.create_server`, which gives a TLS handshake 60 s
and takes every connection offered. Here the TCP listener accepts connections itself:

- at most `per_address` open connections from one client address and `total` in all; one
  more is closed as soon as it is accepted, so the kernel's queue never fills and the
  agent's file descriptors stay free for the Unix socket, the job store and job logs;
- a TLS handshake that has not finished in `HANDSHAKE_TIMEOUT` seconds is dropped;
- each connection is then served by `protocol.BoundedHttpProtocol`, which bounds the
  request head and its time, and releases the connection's place when it ends.

The Unix socket keeps uvicorn's own server: only the agent's user can reach it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections import Counter
from typing import Any

from gpuhop.agent.server.protocol import BoundedHttpProtocol

log = logging.getLogger("gpuhop.agent")

PER_ADDRESS = 128
MAX_CONNECTIONS = 4096
HANDSHAKE_TIMEOUT = 10.0
TLS_SHUTDOWN_TIMEOUT = 5.0
# File descriptors kept out of the listener's reach, whatever the limit: the Unix socket's
# clients, the job store, job logs and the processes the agent starts.
RESERVED_FDS = 256


def total_for(fd_limit: int) -> int:
    """How many TCP connections at once, given the agent's open-file limit."""
    return max(16, min(MAX_CONNECTIONS, (fd_limit - RESERVED_FDS) // 2))


class ConnectionBounds:
    """Counts the open connections of each client address and in all."""

    def __init__(self, per_address: int = PER_ADDRESS, total: int = MAX_CONNECTIONS):
        self.per_address = per_address
        self.total = total
        self.open: Counter[str] = Counter()
        self.refused = 0

    def admit(self, address: str) -> bool:
        if self.open[address] >= self.per_address or sum(self.open.values()) >= self.total:
            self.refused += 1
            return False
        self.open[address] += 1
        return True

    def release(self, address: str) -> None:
        self.open[address] -= 1
        if self.open[address] <= 0:
            del self.open[address]


class BoundedListener:
    """Accepts on `sock` and serves each admitted connection with uvicorn's config."""

    def __init__(self, sock: socket.socket, server: Any, bounds: ConnectionBounds):
        self.sock = sock
        self.server = server  # the uvicorn Server whose config and state the protocols share
        self.bounds = bounds
        self._task: asyncio.Task[None] | None = None
        self._handshakes: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self.sock.setblocking(False)
        self._task = asyncio.get_running_loop().create_task(self._accept(), name="listener")

    # The two methods uvicorn's shutdown calls on each of its servers.
    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for task in list(self._handshakes):
            task.cancel()

    async def wait_closed(self) -> None:
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, peer = await loop.sock_accept(self.sock)
            except OSError as e:
                # Out of file descriptors, or the peer gave up in the queue: keep serving.
                log.warning("the TCP listener could not accept a connection: %s", e)
                await asyncio.sleep(0.1)
                continue
            address = str(peer[0]) if isinstance(peer, tuple) else str(peer)
            if not self.bounds.admit(address):
                _drop(conn)
                continue
            task = loop.create_task(self._serve(conn, address))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _serve(self, conn: socket.socket, address: str) -> None:
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.bounds.release(address)

        config = self.server.config
        loop = asyncio.get_running_loop()

        def protocol() -> BoundedHttpProtocol:
            return BoundedHttpProtocol(
                config=config,
                server_state=self.server.server_state,
                app_state=self.server.lifespan.state,
                _loop=loop,
                on_lost=release,
            )

        tls: dict[str, Any] = {}
        if config.ssl is not None:
            tls = {
                "ssl": config.ssl,
                "ssl_handshake_timeout": HANDSHAKE_TIMEOUT,
                "ssl_shutdown_timeout": TLS_SHUTDOWN_TIMEOUT,
            }
        try:
            await loop.connect_accepted_socket(protocol, conn, **tls)
        # A failed or timed-out handshake, or the agent stopping: the loop owns the socket
        # now and has closed it; the protocol never started, so its place is freed here.
        except asyncio.CancelledError:
            release()
            raise
        except Exception:
            release()


def _drop(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.close()
