"""Runs on the user's machine: HTTP/1.1 to an agent's Unix socket with the standard library.

The local agent's socket and the local end of an SSH tunnel need no TLS and no HTTP/2:
`http.client` over AF_UNIX does what the SDK asks of them (one kept-alive connection,
chunked uploads, streamed answers for `logs -f`) and spares every command httpx, httpcore
and h11 at start-up. TLS remotes keep httpx (session.py picks).

What it offers is the part of httpx's `Client` and `Response` that the SDK uses: `request`
and `stream` with params, json, content, headers and a timeout; `status_code`, `headers`,
`json()`, `text`, `content`, `read()` and `iter_raw()`. Whatever keeps a request from
getting through (refused, reset, timed out, a broken answer) is raised as `TransportError`.
"""

from __future__ import annotations

import contextlib
import http.client
import json as jsonlib
import select
import socket
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode


class TransportError(Exception):
    """A request that did not get through, or an answer cut off."""


@dataclass(frozen=True)
class Timeout:
    """Seconds to wait: for the connection, and for each read (None: as long as it takes)."""

    read: float | None
    connect: float = 5.0


READ_SIZE = 64 * 1024
MAX_IDLE = 4


class Response:
    """An answer: its body read in full (`request`) or as it comes (`stream`)."""

    def __init__(self, raw: http.client.HTTPResponse, release: Any) -> None:
        self._raw = raw
        self._release = release
        self._content: bytes | None = None
        self._released = False
        self.status_code = raw.status
        self.headers = raw.headers

    def read(self) -> bytes:
        if self._content is None:
            try:
                self._content = self._raw.read()
            except (OSError, http.client.HTTPException) as e:
                raise TransportError(f"the answer was cut off: {e}") from e
            finally:
                self.close()
        return self._content

    @property
    def content(self) -> bytes:
        return self.read()

    @property
    def text(self) -> str:
        return self.read().decode("utf-8", errors="replace")

    def json(self) -> Any:
        return jsonlib.loads(self.read())

    def iter_raw(self, chunk_size: int | None = None) -> Iterator[bytes]:
        """The body as it arrives: what the agent has written so far, at most `chunk_size`
        bytes a piece, never waiting for a full buffer."""
        try:
            while chunk := self._raw.read1(chunk_size or READ_SIZE):
                yield chunk
        except (OSError, http.client.HTTPException) as e:
            raise TransportError(f"the answer was cut off: {e}") from e
        finally:
            self.close()

    iter_bytes = iter_raw  # the agent sends no content-encoding

    def close(self) -> None:
        if not self._released:
            self._released = True
            self._release(self._raw)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, connect_timeout: float) -> None:
        super().__init__("gpuhop", timeout=connect_timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.path)
        except OSError:
            sock.close()  # never left for the garbage collector (a ResourceWarning)
            raise
        self.sock = sock


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

    def __init__(self, path: str, headers: Mapping[str, str], timeout: Timeout) -> None:
        self.path = path
        self.headers = dict(headers)
        self.timeout = timeout
        self._idle: list[_UnixConnection] = []
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _connection(self, timeout: Timeout) -> _UnixConnection:
        """An idle connection the agent has not closed meanwhile, else a new one."""
        conn = None
        while conn is None:
            with self._lock:
                if not self._idle:
                    break
                conn = self._idle.pop()
            if conn.sock is None or _closed(conn.sock):
                conn.close()
                conn = None
        if conn is None:
            conn = _UnixConnection(self.path, timeout.connect)
            conn.connect()
        assert conn.sock is not None
        conn.sock.settimeout(timeout.read)
        return conn

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

    def _give_back(self, conn: _UnixConnection, answer: http.client.HTTPResponse) -> None:
        reusable = answer.isclosed() and not answer.will_close  # read to its end
        answer.close()
        if reusable:
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
        try:
            conn = self._connection(self._timeout(timeout))
            try:
                conn.request(method, url + query(params), body=body, headers=sent)
                raw = conn.getresponse()
            except BaseException:
                conn.close()
                raise
        except (OSError, http.client.HTTPException) as e:
            raise TransportError(str(e) or type(e).__name__) from e
        return Response(raw, lambda answer: self._give_back(conn, answer))

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


def _closed(sock: socket.socket) -> bool:
    """Whether the peer closed an idle connection: readable with nothing to read."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True
