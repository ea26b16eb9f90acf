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
