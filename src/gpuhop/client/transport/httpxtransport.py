"""Runs on the user's machine: httpx's transport to an endpoint, for a TLS remote (and the
dashboard's asyncio proxy, and tests that speak httpx). Imported only where used: an agent on
a Unix socket is spoken to with the standard library (unixhttp)."""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import httpcore
from httpcore._backends.sync import SyncStream

from gpuhop.client.transport.httpxmodule import httpx_module
from gpuhop.client.transport.unixhttp import Timeout

if TYPE_CHECKING:
    import httpx
else:
    httpx = httpx_module()  # without its CLI

# No TLS on a Unix socket. An empty client context (verification on, no CAs) saves loading
# the CA bundle, about 75 ms.
_NO_TLS = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)

# An idle connection is given up after this long: before the agent closes it
# (gpuhop.agent.server.protocol.KEEP_ALIVE_TIMEOUT, 5 s), so that no request is sent on one
# as the agent closes it. With both at 5 s (httpx's default), such a request failed
# ("Server disconnected without sending a response"), a network's latency widening the race.
KEEP_ALIVE_SECONDS = 2.0
_LIMITS = httpx.Limits(keepalive_expiry=KEEP_ALIVE_SECONDS)


class HttpxClient:
    """httpx's Client behind the session's seam (`transport.HttpClient`): a TLS remote, or
    a transport a test gives. Takes the SDK's `Timeout`, as `UnixClient` does."""

    errors: tuple[type[Exception], ...] = (httpx.TransportError, httpx.StreamError)

    def __init__(
        self,
        transport: httpx.BaseTransport,
        base_url: str,
        headers: Mapping[str, str],
        timeout: Timeout,
    ) -> None:
        self._client = httpx.Client(
            transport=transport, base_url=base_url, headers=headers, timeout=_timeout(timeout)
        )

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        return self._client.request(method, url, **_options(kwargs))

    @contextlib.contextmanager
    def stream(self, method: str, url: str, **kwargs: Any) -> Iterator[httpx.Response]:
        with self._client.stream(method, url, **_options(kwargs)) as response:
            yield response

    def close(self) -> None:
        self._client.close()


def _timeout(timeout: Timeout) -> httpx.Timeout:
    return httpx.Timeout(timeout.read, connect=timeout.connect)


def _options(kwargs: dict[str, Any]) -> dict[str, Any]:
    if isinstance(kwargs.get("timeout"), Timeout):
        kwargs["timeout"] = _timeout(kwargs["timeout"])
    return kwargs


def sync_transport(uds: str | None, context: ssl.SSLContext | None) -> httpx.BaseTransport:
    return _Transport(uds=uds, verify=context or _NO_TLS)


def async_transport(uds: str | None, context: ssl.SSLContext | None) -> httpx.AsyncBaseTransport:
    return httpx.AsyncHTTPTransport(uds=uds, verify=context or _NO_TLS, limits=_LIMITS)


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
        super().__init__(uds=uds, verify=verify, limits=_LIMITS)
        # httpx takes no network backend of its own; its pool has made no connection yet,
        # and each new one takes the pool's backend.
        pool = self._pool
        assert isinstance(pool, httpcore.ConnectionPool) and hasattr(pool, "_network_backend")
        pool._network_backend = _UnixBackend()
