"""The SDK's HTTP/1.1 on a plain socket (client/transport/http1.py, under
client/transport/unixhttp.py), against a server on a real Unix socket that answers with
exactly the bytes each test gives: every way an answer's body is framed, a request body of
unknown length, and the answers that are broken, each a TransportError that says what
broke."""

from __future__ import annotations

import socket
import tempfile
import threading
from collections.abc import Callable, Iterator

import pytest

from gpuhop.client.transport.unixhttp import Timeout, TransportError, UnixClient

Handler = Callable[[socket.socket, bytes], None]


def read_request(conn: socket.socket) -> bytes:
    """One request's head (and nothing after it)."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = conn.recv(1)
        if not piece:
            return data
        data += piece
    return data


class Server:
    """Accepts connections on a Unix socket; each request is answered by `handler`, given
    the connection and the request's head. Counts the connections it accepted."""

    def __init__(self, path: str, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen()
        self.threads: list[threading.Thread] = []
        self.accepting = threading.Thread(target=self._accept, daemon=True)
        self.accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            self.connections += 1
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while head := read_request(conn):
                self.handler(conn, head)

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.accepting.join(10)
        for thread in self.threads:
            thread.join(10)


@pytest.fixture
def serve() -> Iterator[Callable[[Handler], UnixClient]]:
    made: list[tuple[Server, UnixClient]] = []
    with tempfile.TemporaryDirectory(prefix="http1-") as tmp:

        def start(handler: Handler) -> UnixClient:
            path = f"{tmp}/{len(made)}.sock"
            server = Server(path, handler)
            client = UnixClient(path, {"X-Test": "1"}, Timeout(10.0, connect=5.0))
            made.append((server, client))
            client.server = server  # type: ignore[attr-defined]
            return client

        try:
            yield start
        finally:
            for server, client in made:
                client.close()
                server.close()


def answer(body: bytes, *headers: str) -> Handler:
    def handle(conn: socket.socket, head: bytes) -> None:
        lines = ["HTTP/1.1 200 OK", *headers]
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)

    return handle


def test_a_content_length_answer_keeps_its_connection(serve):
    http = serve(answer(b'{"a": 1}', "Content-Length: 8", "Content-Type: application/json"))
    assert http.get("/x").json() == {"a": 1}
    response = http.get("/y")
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    assert http.server.connections == 1  # the second request went on the first connection


def test_a_chunked_answer_comes_piece_by_piece(serve):
    sent_first, read_first = threading.Event(), threading.Event()

    def handle(conn: socket.socket, head: bytes) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nhel\r\n")
        sent_first.set()
        read_first.wait(10)  # the second piece only once the client has shown the first
        conn.sendall(b"3\r\nlo\n\r\n0\r\nTrailer: x\r\n\r\n")

    http = serve(handle)
    with http.stream("GET", "/log") as response:
        pieces = response.iter_raw()
        assert next(pieces) == b"hel"
        read_first.set()
        assert b"".join(pieces) == b"lo\n"
    assert http.get("/again").content == b"hel" + b"lo\n"
    assert http.server.connections == 1


def test_an_answer_up_to_the_close_is_read_to_it_and_not_kept(serve):
    def handle(conn: socket.socket, head: bytes) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")
        conn.shutdown(socket.SHUT_WR)

    http = serve(handle)
    assert http.get("/x").text == "all of it"
    assert http.get("/x").text == "all of it"
    assert http.server.connections == 2


def test_a_body_of_unknown_length_is_sent_chunked_and_a_known_one_as_it_is(serve):
    received: list[bytes] = []

    def handle(conn: socket.socket, head: bytes) -> None:
        received.append(head)
        body = b""
        if b"chunked" in head:
            while not body.endswith(b"0\r\n\r\n"):
                body += conn.recv(65536)
        elif b"content-length: 6" in head.lower():
            while len(body) < 6:
                body += conn.recv(65536)
        received.append(body)
        conn.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")

    http = serve(handle)
    assert http.post("/up", content=iter([b"abc", b"", b"defgh"])).status_code == 204
    assert received[1] == b"3\r\nabc\r\n5\r\ndefgh\r\n0\r\n\r\n"
    http.post("/up", content=iter([b"abc", b"def"]), headers={"content-length": "6"})
    assert received[3] == b"abcdef" and b"Transfer-Encoding" not in received[2]
    http.post("/empty")
    assert b"Content-Length: 0" in received[4] and b"X-Test: 1" in received[4]
    assert http.server.connections == 1


def test_a_body_of_any_size_or_buffer_type_arrives_whole(serve):
    received: list[bytes] = []

    def handle(conn: socket.socket, head: bytes) -> None:
        size = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        body = b""
        while len(body) < size:
            body += conn.recv(1 << 20)
        received.append(body)
        conn.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")

    http = serve(handle)
    big = bytes(range(256)) * 4096  # 1 MiB: sent apart from the head
    for body in (b"small", bytearray(b"array"), memoryview(b"view"), big, memoryview(big)):
        http.post("/up", content=body)
    assert received == [b"small", b"array", b"view", big, big]


@pytest.mark.parametrize(
    ("sent", "said"),
    [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "is not HTTP"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "mid-answer"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: many\r\n\r\n", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "bad header"),
        (b"", "closed the connection before it answered"),
    ],
)
def test_a_broken_answer_says_what_broke(serve, sent, said):
    def handle(conn: socket.socket, head: bytes) -> None:
        conn.sendall(sent)
        conn.shutdown(socket.SHUT_WR)

    http = serve(handle)
    with pytest.raises(TransportError, match=said):
        http.get("/x")


def test_a_url_that_would_break_the_request_line_is_refused(serve):
    http = serve(answer(b"", "Content-Length: 0"))
    with pytest.raises(ValueError, match="space, a control character"):
        http.get("/a b")
    with pytest.raises(ValueError, match="line break"):
        http.get("/x", headers={"X-Evil": "a\r\nInjected: 1"})


def test_nothing_listening_is_a_transport_error(tmp_path):
    http = UnixClient(str(tmp_path / "none.sock"), {}, Timeout(1.0))
    with pytest.raises(TransportError):
        http.get("/x")
