"""Runs on the user's machine: how the client reaches an agent (the transport seam).

Every way in is an `Endpoint`: the local agent's Unix socket, the local end of an SSH
tunnel to a remote agent's socket (also a Unix socket), or a team agent's TLS listener
with a pinned certificate and a bearer token. HTTP requests go through `transport()`;
streams that are not HTTP (port forwarding) open a WebSocket to the same place with the
same credentials.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import httpcore
import httpx
from httpcore._backends.sync import SyncStream

from gpuhop.client.embedded import ensure_agent, socket_answers
from gpuhop.home import AgentPaths


@dataclass
class Endpoint:
    """Where an agent answers and how to speak to it."""

    description: str
    """Names the agent in error messages: "the local agent at ...", "remote 'lab' (...)"."""
    base_url: str = "http://gpuhop"
    uds: str | None = None
    """A Unix socket to connect to instead of base_url's host and port."""
    ssl_context: ssl.SSLContext | None = None
    headers: dict[str, str] = field(default_factory=dict)
    """Sent with every request and WebSocket handshake (the bearer token)."""
    reachable: Callable[[], bool] = lambda: True
    """Whether reconnecting is worth a try now (cheap; called before each reconnect)."""
    explain: Callable[[BaseException], str | None] = lambda exc: None
    """Why a request failed to get through, in words that say more than the transport
    error, when the transport can find out (the SSH transport asks the host whether its
    agent runs; the TLS one names a certificate that is not the pinned one)."""

    def transport(self) -> httpx.BaseTransport:
        # No TLS on a Unix socket. An empty client context (verification on, no CAs) saves
        # loading the CA bundle, about 75 ms of every command.
        return _Transport(uds=self.uds, verify=self.ssl_context or _NO_TLS)

    def async_transport(self) -> httpx.AsyncBaseTransport:
        """The same connection for an asyncio client (the dashboard's proxy)."""
        return httpx.AsyncHTTPTransport(uds=self.uds, verify=self.ssl_context or _NO_TLS)

    def websocket_url(self, path: str) -> str:
        """The ws:// or wss:// URL of an API path on this endpoint."""
        scheme, _, rest = self.base_url.partition("://")
        return f"{'wss' if scheme == 'https' else 'ws'}://{rest}{path}"


def local_endpoint(paths: AgentPaths, autostart: bool = True) -> Endpoint:
    """The agent of `paths` on this machine, started first if asked to."""
    if autostart:
        ensure_agent(paths)
    return Endpoint(
        description=f"the gpuhop agent at {paths.socket}",
        uds=str(paths.socket),
        reachable=lambda: socket_answers(paths.socket),
    )


_NO_TLS = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


class _UnixBackend(httpcore.SyncBackend):
    """httpcore's own network backend, but a Unix socket whose connect() fails is closed.

    httpcore 1.0 leaves it open (its connect_unix_socket has no cleanup), so every retry
    against an agent that is down or restarting (a stale socket file) leaked a file
    descriptor until the garbage collector found it, with a ResourceWarning. Its asyncio
    backend (anyio's connect_unix) closes the socket itself.
    """

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            for option in socket_options or ():
                sock.setsockopt(*option)
            sock.settimeout(timeout)
            sock.connect(path)
        except TimeoutError as e:
            sock.close()
            raise httpcore.ConnectTimeout(e) from e
        except OSError as e:
            sock.close()
            raise httpcore.ConnectError(e) from e
        return SyncStream(sock)


class _Transport(httpx.HTTPTransport):
    """httpx's transport, its connection pool on `_UnixBackend`."""

    def __init__(self, uds: str | None, verify: ssl.SSLContext) -> None:
        super().__init__(uds=uds, verify=verify)
        # httpx takes no network backend of its own; its pool has made no connection yet,
        # and each new one takes the pool's backend.
        pool = self._pool
        assert isinstance(pool, httpcore.ConnectionPool) and hasattr(pool, "_network_backend")
        pool._network_backend = _UnixBackend()
