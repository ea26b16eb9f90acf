"""Runs on the user's machine: HTTP/1.1 to an agent's Unix socket, on a plain socket.

The local agent's socket and the local end of an SSH tunnel need no TLS and no HTTP/2: the
requests and answers are framed by `gpuhop.client.transport.http1` over `socket`, which
every command has loaded anyway; httpx, and the standard library's `http.client` (with
`email`), are spared at start-up. TLS remotes keep httpx (session.py picks).

What it offers is the part of httpx's `Client` and `Response` that the SDK uses: `request`
and `stream` with params, json, content, headers and a timeout; `status_code`, `headers`,
`json()`, `text`, `content`, `read()` and `iter_raw()`. Whatever keeps a request from
getting through (refused, reset, timed out, a broken answer) is raised as `TransportError`.
"""

from __future__ import annotations

import contextlib
import json as jsonlib
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import urlencode

from gpuhop.client.transport.http1 import (
    ConnectError,
    Connection,
    Response,
    TransportError,
    request_head,
)

__all__ = ["ConnectError", "Response", "Timeout", "TransportError", "UnixClient", "query"]


class Timeout:
    """Seconds to wait: for the connection, and for each read (None: as long as it takes)."""

    __slots__ = ("connect", "read")

    def __init__(self, read: float | None, connect: float = 5.0) -> None:
        self.read = read
        self.connect = connect

    def __repr__(self) -> str:
        return f"Timeout(read={self.read!r}, connect={self.connect!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Timeout):
            return NotImplemented
        return (self.read, self.connect) == (other.read, other.connect)

    def __hash__(self) -> int:
        return hash((self.read, self.connect))


MAX_IDLE = 4


def _param(value: object) -> str:
    # As httpx writes them: the agent's boolean query parameters read true/false.
    if value is True:
        return "true"
    if value is False:
        return "false"
    return "" if value is None else str(value)


def query(params: Mapping[str, object] | Iterable[tuple[str, object]] | None) -> str:
    """`?a=1&b=x` of a mapping (a list value: the key repeated) or of (key, value) pairs."""
    if not params:
        return ""
    items = params.items() if isinstance(params, Mapping) else params
    pairs = [
        (key, _param(item))
        for key, value in items
        for item in (value if isinstance(value, list | tuple) else [value])
    ]
    return "?" + urlencode(pairs)


class UnixClient:
    """Connections kept alive to the HTTP server on a Unix socket, shared by threads (the
    status line polls while the log streams): each request takes an idle connection or
    opens one, and gives it back when its answer has been read to the end."""

    errors: tuple[type[Exception], ...] = (TransportError,)

    def __init__(
        self,
        path: str,
        headers: Mapping[str, str],
        timeout: Timeout,
        connected: socket.socket | None = None,
        reconnect: Callable[[], bool] | None = None,
    ) -> None:
        """`connected`: a connection to `path` made already (the endpoint's probe), which
        the first request goes on. `reconnect`: asked, when no connection to `path` can be
        opened, to open the way again (the SSH transport's tunnel, whose master connection
        dropped); where it says it did, the connection is tried once more."""
        self.path = path
        self.headers = dict(headers)
        self.timeout = timeout
        self._reconnect = reconnect
        self._idle: list[Connection] = [] if connected is None else [Connection(connected)]
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _connection(self, timeout: Timeout, reuse: bool = True) -> tuple[Connection, bool]:
        """An idle connection the agent has not closed meanwhile (and True), else a new one
        (and False)."""
        conn = None
        while conn is None and reuse:
            with self._lock:
                if not self._idle:
                    break
                conn = self._idle.pop()
            if not conn.idle_and_open():
                conn.close()
                conn = None
        reused = conn is not None
        if conn is None:
            conn = self._open(timeout.connect)
        conn.sock.settimeout(timeout.read)
        return conn, reused

    def _open(self, connect_timeout: float | None) -> Connection:
        """A new connection, or ConnectError. Nothing has been sent when one cannot be
        opened, so trying again after `reconnect` can never run a request twice."""
        try:
            return Connection.open(self.path, connect_timeout)
        except OSError as e:
            if self._reconnect is None or not self._reconnect():
                raise ConnectError(str(e) or type(e).__name__) from e
        try:
            return Connection.open(self.path, connect_timeout)
        except OSError as e:
            raise ConnectError(str(e) or type(e).__name__) from e

    def _timeout(self, given: object) -> Timeout:
        """As httpx reads `timeout`: left out, the client's; a number (or None, no limit)
        for the connect and each read alike; or a Timeout."""
        if given is ...:
            return self.timeout
        if isinstance(given, Timeout):
            return given
        if given is None or isinstance(given, int | float):
            return Timeout(given, connect=given if given is not None else self.timeout.connect)
        raise TypeError(f"timeout takes seconds or a Timeout, not {given!r}")

    def _give_back(self, conn: Connection) -> None:
        with self._lock:
            if len(self._idle) < MAX_IDLE:
                self._idle.append(conn)
                return
        conn.close()

    def _send(
        self,
        method: str,
        url: str,
        params: Mapping[str, object] | Iterable[tuple[str, object]] | None = None,
        json: object = None,
        content: bytes | Iterable[bytes] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: object = ...,
    ) -> Response:
        sent = {**self.headers, **(headers or {})}
        body: bytes | Iterable[bytes] | None = content
        if json is not None:
            body = jsonlib.dumps(json).encode()
            sent["Content-Type"] = "application/json"
        names = {key.lower() for key in sent}
        chunked = False
        if isinstance(body, bytes | bytearray | memoryview):
            if "content-length" not in names:
                sent["Content-Length"] = str(len(body))
        elif body is not None and "content-length" not in names:
            chunked = True  # an iterable of unknown length
            sent["Transfer-Encoding"] = "chunked"
        elif body is None and method in ("POST", "PUT", "PATCH"):
            sent.setdefault("Content-Length", "0")
        head = request_head(method, url + query(params), sent)
        settimeout = self._timeout(timeout)
        # A body that can be sent again: where the agent closed an idle connection just as
        # it was taken (its keep-alive time ran out between the look and the send), the
        # send fails before the agent read a byte of it, and goes again on a new one.
        again = body is None or isinstance(body, bytes | bytearray | memoryview)
        try:
            conn, reused = self._connection(settimeout)
            try:
                try:
                    conn.send_request(head, body, chunked)
                except (BrokenPipeError, ConnectionResetError):
                    if not (reused and again):
                        raise
                    conn.close()
                    conn, _ = self._connection(settimeout, reuse=False)
                    conn.send_request(head, body, chunked)
                return Response(conn, method, self._give_back)
            except BaseException:
                conn.close()
                raise
        except OSError as e:
            raise TransportError(str(e) or type(e).__name__) from e

    def request(self, method: str, url: str, **kwargs: Any) -> Response:
        response = self._send(method, url, **kwargs)
        response.read()
        return response

    @contextlib.contextmanager
    def stream(self, method: str, url: str, **kwargs: Any) -> Iterator[Response]:
        response = self._send(method, url, **kwargs)
        try:
            yield response
        finally:
            response.close()

    def get(self, url: str, **kwargs: Any) -> Response:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> Response:
        return self.request("POST", url, **kwargs)
