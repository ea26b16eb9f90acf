"""Runs on the user's machine: HTTP/1.1 on a plain socket, the part the SDK speaks to an
agent's Unix socket (`unixhttp`): a request is a head and a body (of a known length, or
chunked), an answer a status line, headers and a body of a known length, chunked, or up to
the close (RFC 9112).

The standard library's `http.client` does as much, but loads `email` (for its headers) and,
through its callers, `ssl`: tens of milliseconds of every command's start. Anything that
keeps an answer from being read (a broken head, a body cut off) is `TransportError`.
"""

from __future__ import annotations

import json as jsonlib
import select
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any


class TransportError(Exception):
    """A request that did not get through, or an answer cut off."""


class ConnectError(TransportError):
    """No connection could be opened (refused, no socket there): nothing was sent, so the
    request may go again once the way is open (an SSH tunnel reopened)."""


READ_SIZE = 64 * 1024
# Limits on an answer's head, as http.client keeps them: a line, and the number of headers.
MAX_LINE = 65536
MAX_HEADERS = 100


class Connection:
    """One connection to the socket, and what has been received on it but not yet read."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = b""

    @classmethod
    def open(cls, path: str, connect_timeout: float | None) -> Connection:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(connect_timeout)
            sock.connect(path)
        except OSError:
            sock.close()  # never left for the garbage collector (a ResourceWarning)
            raise
        return cls(sock)

    def close(self) -> None:
        self.sock.close()

    def idle_and_open(self) -> bool:
        """Whether the agent left the idle connection open: nothing to read (a closed
        connection reads as b"" at once)."""
        if self._buffer:
            return False  # an answer nobody asked for: not to be read as the next one's
        readable, _, _ = select.select([self.sock], [], [], 0)
        if not readable:
            return True
        try:
            return self.sock.recv(1, socket.MSG_PEEK) != b""
        except OSError:
            return False

    def recv_some(self, limit: int) -> bytes:
        """Up to `limit` bytes: what was received already, else one read (b"": closed)."""
        if self._buffer:
            data, self._buffer = self._buffer[:limit], self._buffer[limit:]
            return data
        return self.sock.recv(limit)

    def recv_exactly(self, size: int) -> bytes:
        parts = []
        while size:
            data = self.recv_some(size)
            if not data:
                raise TransportError("the agent closed the connection mid-answer")
            parts.append(data)
            size -= len(data)
        return b"".join(parts)

    def recv_line(self) -> bytes:
        """One line, its line end included."""
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                line, self._buffer = self._buffer[: end + 1], self._buffer[end + 1 :]
                return line
            if len(self._buffer) > MAX_LINE:
                raise TransportError("the agent's answer has a line over 64 KiB")
            data = self.sock.recv(READ_SIZE)
            if not data:
                raise TransportError("the agent closed the connection before it answered")
            self._buffer += data

    def send_request(
        self, head: bytes, body: bytes | Iterable[bytes] | None, chunked: bool
    ) -> None:
        sock = self.sock
        if body is None:
            sock.sendall(head)
        elif isinstance(body, bytes | bytearray | memoryview):
            if len(body) < READ_SIZE:  # one write for a small request: head and body
                sock.sendall(head + bytes(body))
            else:  # not copied to be joined
                sock.sendall(head)
                sock.sendall(body)
        else:
            sock.sendall(head)
            for piece in body:
                if not piece:
                    continue  # an empty chunk would end a chunked body
                if chunked and len(piece) < READ_SIZE:  # one write, the piece copied in
                    sock.sendall(b"%X\r\n%b\r\n" % (len(piece), piece))
                elif chunked:  # a large piece (a dataset chunk): sent where it lies
                    send_parts(sock, [b"%X\r\n" % len(piece), piece, b"\r\n"])
                else:
                    sock.sendall(piece)
            if chunked:
                sock.sendall(b"0\r\n\r\n")


def send_parts(sock: socket.socket, parts: list[bytes | bytearray | memoryview]) -> None:
    """Send `parts` one after another in as few writes as the socket takes (sendmsg), none
    of them copied into one."""
    views = [memoryview(p).cast("B") for p in parts]
    while views:
        sent = sock.sendmsg(views)
        while sent:
            if sent >= len(views[0]):
                sent -= len(views.pop(0))
            else:
                views[0], sent = views[0][sent:], 0


def request_head(method: str, url: str, headers: Mapping[str, str]) -> bytes:
    if not url.isascii() or any(c <= " " or c == "\x7f" for c in url):
        raise ValueError(f"a URL holds a space, a control character or non-ASCII: {url!r}")
    lines = [f"{method} {url} HTTP/1.1", "Host: gpuhop"]
    for key, value in headers.items():
        if "\n" in key or "\r" in key or "\n" in value or "\r" in value:
            raise ValueError(f"header {key!r} holds a line break")
        lines.append(f"{key}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class Response:
    """An answer: its body read in full (`request`) or as it comes (`stream`).

    Its body is framed as the agent says: Content-Length, chunked, or up to the close.
    `headers` maps each header's lower-case name to its (last) value."""

    def __init__(
        self,
        conn: Connection,
        method: str,
        release: Callable[[Connection], None],
    ) -> None:
        self._conn = conn
        self._release = release
        self._content: bytes | None = None
        self._released = False
        self._ended = False
        self._chunk_left = 0  # of the chunk being read (chunked bodies)
        self._left: int | None = None  # of a Content-Length body
        self._chunked = False
        self._until_close = False
        self.status_code, self.headers, keep_alive = self._read_head(conn)
        self.will_close = not keep_alive
        if method == "HEAD" or self.status_code in (204, 304) or self.status_code < 200:
            self._ended = True
        elif "chunked" in self.headers.get("transfer-encoding", "").lower():
            self._chunked = True
        elif "content-length" in self.headers:
            try:
                self._left = int(self.headers["content-length"])
            except ValueError:
                raise TransportError("the agent's answer has a bad Content-Length") from None
            if self._left < 0:
                raise TransportError("the agent's answer has a bad Content-Length")
            self._ended = self._left == 0
        else:
            self._until_close = self.will_close = True

    @staticmethod
    def _read_head(conn: Connection) -> tuple[int, dict[str, str], bool]:
        while True:  # an interim 100 Continue is skipped
            status = conn.recv_line().decode("latin-1")
            version, _, rest = status.partition(" ")
            code = rest[:3]
            if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
                raise TransportError(f"the agent's answer is not HTTP: {status.strip()!r}")
            headers: dict[str, str] = {}
            while (line := conn.recv_line()) not in (b"\r\n", b"\n"):
                if len(headers) >= MAX_HEADERS:
                    raise TransportError(f"the agent's answer has over {MAX_HEADERS} headers")
                key, sep, value = line.decode("latin-1").partition(":")
                if not sep:
                    raise TransportError(f"the agent's answer has a bad header: {line!r}")
                headers[key.strip().lower()] = value.strip()
            if int(code) != 100:
                break
        connection = headers.get("connection", "").lower()
        keep_alive = "close" not in connection and (
            version != "HTTP/1.0" or "keep-alive" in connection
        )
        return int(code), headers, keep_alive

    def _read1(self, limit: int) -> bytes:
        """Up to `limit` bytes of the body, as soon as any have come; b"" at its end."""
        conn = self._conn
        if self._ended:
            return b""
        if self._chunked:
            if not self._chunk_left:
                size = conn.recv_line().split(b";", 1)[0].strip()
                try:
                    self._chunk_left = int(size, 16)
                except ValueError:
                    raise TransportError(f"the agent's answer has a bad chunk: {size!r}") from None
                if not self._chunk_left:
                    while conn.recv_line() not in (b"\r\n", b"\n"):  # trailers
                        pass
                    self._ended = True
                    return b""
            data = conn.recv_some(min(limit, self._chunk_left))
            if not data:
                raise TransportError("the agent closed the connection mid-answer")
            self._chunk_left -= len(data)
            if not self._chunk_left:
                conn.recv_line()  # the chunk's CRLF
            return data
        if self._until_close:
            data = conn.recv_some(limit)
            self._ended = not data
            return data
        assert self._left is not None
        data = conn.recv_some(min(limit, self._left))
        if not data:
            raise TransportError("the agent closed the connection mid-answer")
        self._left -= len(data)
        self._ended = not self._left
        return data

    def read(self) -> bytes:
        if self._content is None:
            try:
                parts = []
                while data := self._read1(READ_SIZE):
                    parts.append(data)
                self._content = b"".join(parts)
            except OSError as e:
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
            while chunk := self._read1(chunk_size or READ_SIZE):
                yield chunk
        except OSError as e:
            raise TransportError(f"the answer was cut off: {e}") from e
        finally:
            self.close()

    iter_bytes = iter_raw  # the agent sends no content-encoding

    def close(self) -> None:
        """Give the connection back: kept for the next request if the body was read to its
        end and the agent keeps it open, else closed."""
        if not self._released:
            self._released = True
            if self._ended and not self.will_close:
                self._release(self._conn)
            else:
                self._conn.close()
