"""The client's transport against an agent that is not there: a clear connect error, and no
socket left open (a log follower retries every fraction of a second while an agent
restarts; each leaked socket is a file descriptor until the garbage collector finds it)."""

from __future__ import annotations

import gc
import socket
from pathlib import Path

import httpx
import pytest

from gpuhop.client.transport.base import Endpoint


def _stale_socket(path: Path) -> Path:
    """A socket file nobody listens on, as an agent killed with SIGKILL leaves behind."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))
    return path


@pytest.mark.parametrize("kind", ["missing", "stale"])
def test_a_failed_connect_to_a_unix_socket_leaks_no_socket(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "agent.sock"
    if kind == "stale":
        _stale_socket(path)
    endpoint = Endpoint("the agent", uds=str(path))
    with httpx.Client(transport=endpoint.transport(), base_url=endpoint.base_url) as http:
        for _ in range(3):
            with pytest.raises(httpx.ConnectError):
                http.get("/v1/info")
    # An unclosed socket would warn here (ResourceWarning, an error in this suite).
    gc.collect()


def test_the_transport_still_speaks_http_over_a_unix_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "echo.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen(1)
        endpoint = Endpoint("the agent", uds=path)
        with httpx.Client(transport=endpoint.transport(), base_url=endpoint.base_url) as http:
            import threading

            def answer() -> None:
                conn, _ = server.accept()
                with conn:
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

            t = threading.Thread(target=answer)
            t.start()
            assert http.get("/v1/info").text == "ok"
            t.join()


@pytest.mark.parametrize("kind", ["missing", "stale"])
def test_the_sdk_session_on_a_dead_socket_says_so_and_leaks_nothing(
    tmp_path: Path, kind: str
) -> None:
    from gpuhop.client.errors import GpuhopError
    from gpuhop.client.session import Session
    from gpuhop.client.transport.unixhttp import UnixClient

    path = tmp_path / "agent.sock"
    if kind == "stale":
        _stale_socket(path)
    session = Session(Endpoint("the agent at X", uds=str(path)), tmp_path / "cache")
    assert isinstance(session.http, UnixClient)  # the standard library's, not httpx
    try:
        for _ in range(3):
            with pytest.raises(GpuhopError) as caught:
                session.request("GET", "/v1/agent")
            assert caught.value.code == "unreachable"
            assert "cannot reach the agent at X" in caught.value.message
    finally:
        session.close()
    gc.collect()


def test_a_kept_connection_the_agent_closes_as_it_is_taken_is_replaced(tmp_path: Path) -> None:
    """The agent (uvicorn) closes a connection idle for its keep-alive time; where that
    happens between the client's look at the idle connection and its request, the send fails
    (a CI run's teardown got "Broken pipe"), before the agent read a byte: the request goes
    again on a new connection. Made deterministic with a server that stops reading the first
    connection (shutdown SHUT_RD: the look finds it open, a write to it fails with EPIPE)."""
    import threading

    from gpuhop.client.transport.unixhttp import Timeout, UnixClient

    path = str(tmp_path / "agent.sock")
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen(2)
        kept: list[socket.socket] = []
        shut = threading.Event()

        def serve() -> None:
            first, _ = server.accept()
            kept.append(first)
            first.recv(65536)
            first.sendall(answer)
            first.shutdown(socket.SHUT_RD)  # open, but takes no more: as if closing
            shut.set()
            second, _ = server.accept()
            with second:
                second.recv(65536)
                second.sendall(answer)

        t = threading.Thread(target=serve)
        t.start()
        client = UnixClient(path, {"Host": "agent"}, Timeout(10, connect=10))
        try:
            assert client.request("GET", "/v1/info").content == b"ok"
            assert shut.wait(10)
            assert client.request("DELETE", "/v1/secrets/x").content == b"ok"
        finally:
            client.close()
            t.join(10)
            for conn in kept:
                conn.close()
