"""Runs on the user's machine: how the client reaches an agent (the transport seam).

Every way in is an `Endpoint`: the local agent's Unix socket, the local end of an SSH
tunnel to a remote agent's socket (also a Unix socket), or a team agent's TLS listener
with a pinned certificate and a bearer token. A Unix socket is spoken to with the standard
library (unixhttp); TLS through httpx, whose transport `transport()` gives (httpxtransport,
imported only then). Streams that are not HTTP (port forwarding) open a WebSocket to the
same place with the same credentials.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from gpuhop.client.embedded import connect_agent, socket_answers
from gpuhop.home import AgentPaths

if TYPE_CHECKING:
    import socket
    import ssl

    import httpx


class Response(Protocol):
    """An agent's answer, whichever client carried it: its body read in full (`request`)
    or as it arrives (`stream`)."""

    status_code: int

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def content(self) -> bytes: ...

    @property
    def text(self) -> str: ...

    def json(self) -> Any: ...

    def read(self) -> bytes: ...

    def iter_raw(self, chunk_size: int | None = None) -> Iterator[bytes]: ...

    def iter_bytes(self, chunk_size: int | None = None) -> Iterator[bytes]: ...


class HttpClient(Protocol):
    """The one seam every request goes through (`Session.http`): the standard library's
    HTTP/1.1 on a Unix socket (`unixhttp.UnixClient`), or httpx over TLS
    (`httpxtransport.HttpxClient`). Both take a `unixhttp.Timeout` (or seconds) as
    `timeout`, and raise one of `errors` for a request that did not get through."""

    errors: tuple[type[Exception], ...]

    def request(self, method: str, url: str, **kwargs: Any) -> Response: ...

    def stream(
        self, method: str, url: str, **kwargs: Any
    ) -> contextlib.AbstractContextManager[Response]: ...

    def close(self) -> None: ...


def _always() -> bool:
    return True


def _nothing_to_add(exc: BaseException) -> str | None:
    return None


class Endpoint:
    """Where an agent answers and how to speak to it.

    `description` names the agent in error messages: "the local agent at ...", "remote
    'lab' (...)". `uds`: a Unix socket to connect to instead of base_url's host and port.
    `handoff`: the agent's handoff socket, where the agent runs on this host (a forward is
    handed the job's connected socket there; see `gpuhop.client.transport.handoff`). `headers` are
    sent with every request and WebSocket handshake (the bearer token). `reachable()`:
    whether reconnecting is worth a try now (called before each reconnect, and by the Unix
    socket client when no connection can be opened; the SSH transport opens its dropped
    tunnel again here).
    `explain(exc)`: why a request failed to get through, in words that say more than the
    transport error, when the transport can find out (the SSH transport asks the host
    whether its agent runs; the TLS one names a certificate that is not the pinned one).

    `connected`: a connection to `uds` made already (the one that found the agent), which
    the session's first request goes on; the session takes it (`take_connected`).

    A plain class, as the other records on a command's path: `dataclasses` would load
    `inspect`, some 8 ms of every command's start.
    """

    __slots__ = (
        "base_url",
        "connected",
        "description",
        "explain",
        "handoff",
        "headers",
        "reachable",
        "ssl_context",
        "uds",
    )

    def __init__(  # noqa: PLR0913 (a record, kept off dataclasses: see above)
        self,
        description: str,
        base_url: str = "http://gpuhop",
        uds: str | None = None,
        handoff: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        headers: dict[str, str] | None = None,
        reachable: Callable[[], bool] = _always,
        explain: Callable[[BaseException], str | None] = _nothing_to_add,
        connected: socket.socket | None = None,
    ) -> None:
        self.description = description
        self.base_url = base_url
        self.uds = uds
        self.handoff = handoff
        self.ssl_context = ssl_context
        self.headers: dict[str, str] = {} if headers is None else headers
        self.reachable = reachable
        self.explain = explain
        self.connected = connected

    def take_connected(self) -> socket.socket | None:
        """The connection made already, if any, for the caller to use (or close)."""
        connected, self.connected = self.connected, None
        return connected

    def __repr__(self) -> str:
        return f"Endpoint({self.description!r}, uds={self.uds!r}, base_url={self.base_url!r})"

    def transport(self) -> httpx.BaseTransport:
        """An httpx transport to this endpoint (TLS remotes; tests that speak httpx)."""
        from gpuhop.client.transport.httpxtransport import sync_transport

        return sync_transport(self.uds, self.ssl_context)

    def async_transport(self) -> httpx.AsyncBaseTransport:
        """The same connection for an asyncio client (the dashboard's proxy)."""
        from gpuhop.client.transport.httpxtransport import async_transport

        return async_transport(self.uds, self.ssl_context)

    def websocket_url(self, path: str) -> str:
        """The ws:// or wss:// URL of an API path on this endpoint."""
        scheme, _, rest = self.base_url.partition("://")
        return f"{'wss' if scheme == 'https' else 'ws'}://{rest}{path}"


def local_endpoint(paths: AgentPaths, autostart: bool = True) -> Endpoint:
    """The agent of `paths` on this machine, started first if asked to."""
    return Endpoint(
        description=f"the gpuhop agent at {paths.socket}",
        uds=str(paths.socket),
        handoff=str(paths.handoff),
        reachable=lambda: socket_answers(paths.socket),
        connected=connect_agent(paths) if autostart else None,
    )
