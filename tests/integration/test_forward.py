"""Port forwarding through a real agent: a real job's servers, real bytes through the tunnel."""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import threading
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from gpuhop.api import JobState
from gpuhop.client import Client, GpuhopError, Job
from tests.conftest import Agent, wait_until
from tests.ports import free_port

pytestmark = pytest.mark.timeout(120)

# An HTTP file server and a TCP echo server on the host's loopback, as a job would run
# TensorBoard or a notebook. The echo server echoes until EOF, then closes its side.
SERVERS = """
import functools, http.server, os, socket, sys, threading

http_port, echo_port = int(sys.argv[1]), int(sys.argv[2])
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory="www")
web = http.server.ThreadingHTTPServer(("127.0.0.1", http_port), handler)
threading.Thread(target=web.serve_forever, daemon=True).start()

def echo(conn):
    with conn:
        while data := conn.recv(1 << 16):
            conn.sendall(data)

echo_server = socket.create_server(("127.0.0.1", echo_port))
print(f"listening on {http_port} and {echo_port}", flush=True)
while True:
    conn, _ = echo_server.accept()
    threading.Thread(target=echo, args=(conn,), daemon=True).start()
"""
PAGE = "<h1>hello from the GPU host</h1>\n"


def job_log(job: Job) -> bytes:
    return b"".join(job.logs())


def start_servers(client: Client, root: Path) -> tuple[Job, int, int]:
    http_port, echo_port = free_port(), free_port()
    job = client.submit(["servers.py", str(http_port), str(echo_port)], workdir=root)
    wait_until(lambda: b"listening on" in job_log(job), timeout=60)
    return job, http_port, echo_port


@pytest.fixture(scope="module")
def servers(shared_agent: Agent, tmp_path_factory) -> Iterator[tuple[Job, int, int]]:
    """One job serving HTTP and echo for the module's tests; cancelled at the end."""
    root = tmp_path_factory.mktemp("servers")
    (root / "servers.py").write_text(SERVERS)
    (root / "www").mkdir()
    (root / "www" / "index.html").write_text(PAGE)
    with shared_agent.client() as client:
        job, http_port, echo_port = start_servers(client, root)
        yield job, http_port, echo_port
        job.cancel(grace=0)
        job.wait(timeout=30)


def echo_through(address: tuple[str, int], payload: bytes) -> bytes:
    """Send `payload`, half-close, and read until the far side closes."""
    with socket.create_connection(address) as conn:

        def send() -> None:
            conn.sendall(payload)
            conn.shutdown(socket.SHUT_WR)

        sender = threading.Thread(target=send)
        sender.start()
        received = bytearray()
        while data := conn.recv(1 << 20):
            received += data
        sender.join()
    return bytes(received)


def test_http_get_through_a_forward(servers):
    job, http_port, _ = servers
    with job.forward(http_port) as fwd:
        assert fwd.address[0] == "127.0.0.1"
        with urllib.request.urlopen(f"{fwd.url}/index.html", timeout=30) as response:
            assert response.status == 200
            assert response.read().decode() == PAGE
        # A keep-alive client makes several requests over one forwarded connection.
        with httpx.Client(base_url=fwd.url) as http:
            for _ in range(3):
                assert http.get("/index.html").text == PAGE
            assert http.get("/missing").status_code == 404


def test_large_payload_echoes_back_byte_exact_with_half_close(servers):
    job, _, echo_port = servers
    payload = os.urandom(24 * 1024 * 1024)
    with job.forward(echo_port) as fwd:
        received = echo_through(fwd.address, payload)
    assert len(received) == len(payload)
    assert hashlib.sha256(received).digest() == hashlib.sha256(payload).digest()


def test_concurrent_connections_stay_apart(servers):
    job, _, echo_port = servers
    payloads = [os.urandom(n) for n in (1, 1000, 300_000, 2_000_000, 5, 64 * 1024)] * 2
    with job.forward(echo_port) as fwd, ThreadPoolExecutor(len(payloads)) as pool:
        results = list(pool.map(lambda p: echo_through(fwd.address, p), payloads))
    assert results == payloads


def test_a_chosen_local_port_and_a_taken_one(servers):
    job, _, echo_port = servers
    port = free_port()
    with job.forward(echo_port, local_port=port) as fwd:
        assert fwd.local_port == port
        assert echo_through(("127.0.0.1", port), b"ping") == b"ping"
        with pytest.raises(GpuhopError, match=f"cannot listen on 127.0.0.1:{port}") as e:
            job.forward(echo_port, local_port=port)
        assert e.value.code == "local_port"


def test_nothing_listening_is_a_clear_error_at_once(servers):
    job, _, _ = servers
    port = free_port()
    with pytest.raises(GpuhopError, match=f"job {job.id} has nothing listening on port {port}"):
        job.forward(port)


def test_bad_port_and_unknown_job(shared_agent, servers):
    job, _, _ = servers
    with shared_agent.client() as client:
        for port in ("0", "65536", "http"):
            response = client.session.http.get(f"/v1/jobs/{job.id}/ports/{port}")
            assert response.status_code == 400
            assert response.json()["code"] == "bad_request"
        with pytest.raises(GpuhopError, match="no job matches 'nosuchjob'") as e:
            Job(client, job.info.model_copy(update={"id": "nosuchjob"})).forward(80)
        assert e.value.status == 404


def test_a_job_that_is_not_running_is_refused(shared_agent, project):
    root = project({"quick.py": "print('done')"})
    with shared_agent.client() as client:
        job = client.submit(["quick.py"], workdir=root)
        job.wait(timeout=60)
        with pytest.raises(
            GpuhopError, match=f"job {job.id} has ended: succeeded, so it has no ports"
        ) as e:
            job.forward(8080)
    assert e.value.status == 409
    assert e.value.detail == {"state": "succeeded"}


def test_websocket_refusals_carry_the_error_body(shared_agent, servers):
    """Each connection is checked again, before the handshake: a plain HTTP error answers."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import unix_connect

    job, _, _ = servers
    port = free_port()
    with pytest.raises(InvalidStatus) as e:
        unix_connect(str(shared_agent.paths.socket), f"ws://gpuhop/v1/jobs/{job.id}/ports/{port}")
    assert e.value.response.status_code == 502
    assert b"has nothing listening on port" in e.value.response.body


def test_a_forward_closes_when_its_job_ends(shared_agent, tmp_path):
    root = tmp_path / "p"
    (root / "www").mkdir(parents=True)
    (root / "servers.py").write_text(SERVERS)
    errors: list[GpuhopError] = []
    with shared_agent.client() as client:
        job, _, echo_port = start_servers(client, root)
        with job.forward(echo_port, on_error=errors.append) as fwd:
            held = socket.create_connection(fwd.address)
            held.sendall(b"still here?")
            assert held.recv(100) == b"still here?"
            job.cancel(grace=0)
            assert fwd.wait(timeout=30)
            assert fwd.ended is not None and fwd.ended.state == JobState.cancelled
            # The open connection ends, and the port no longer answers.
            with held, contextlib.suppress(ConnectionResetError):  # either is an end
                assert held.recv(100) == b""
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(fwd.address, timeout=5).close()
    assert errors == []


def test_a_forward_reaches_only_what_the_job_itself_listens_on(shared_agent, servers, project):
    """A user with any running job (a `sleep` will do) reaches neither another job's port
    nor the host's own, though both listen on the host's loopback."""
    other_job, http_port, echo_port = servers
    root = project({"sleeper.py": "import time\nprint('up', flush=True)\ntime.sleep(300)\n"})
    with socket.create_server(("127.0.0.1", 0)) as host_server, shared_agent.client() as client:
        host_port = host_server.getsockname()[1]
        sleeper = client.submit(["sleeper.py"], workdir=root)
        wait_until(lambda: b"up" in job_log(sleeper), timeout=60)
        try:
            for port in (http_port, echo_port, host_port):
                with pytest.raises(GpuhopError, match=f"nothing listening on port {port}"):
                    sleeper.forward(port)
            # The job that does listen there still reaches it.
            with other_job.forward(echo_port) as fwd:
                assert echo_through(("127.0.0.1", fwd.local_port), b"mine") == b"mine"
        finally:
            sleeper.cancel(grace=0)


# A server that talks without pause once a client has said something (a gRPC server
# answering a probe goes on with more frames).
TALKER = """
import socket, sys, threading, time

def talk(conn):
    with conn:
        try:
            conn.recv(100)
            while True:
                conn.sendall(b"x" * 4096)
                time.sleep(0.0005)
        except OSError:
            pass

server = socket.create_server(("127.0.0.1", int(sys.argv[1])))
print("listening", flush=True)
while True:
    conn, _ = server.accept()
    threading.Thread(target=talk, args=(conn,), daemon=True).start()
"""


def test_local_clients_that_reset_leave_no_error_behind(shared_agent, project, caplog):
    """A local client that closes with bytes unread (a reset, as `gpuhop.tf`'s probe does
    every 2 s) while the job still sends ends its connection quietly: no traceback on the
    user's terminal, and the forward serves the next connection."""
    root = project({"talker.py": TALKER})
    port = free_port()
    with shared_agent.client() as client:
        job = client.submit(["talker.py", str(port)], workdir=root)
        try:
            wait_until(lambda: b"listening" in job_log(job), timeout=60)
            with job.forward(port) as fwd:
                for _ in range(30):
                    with socket.create_connection(fwd.address) as conn:
                        conn.sendall(b"hello")
                        assert conn.recv(10)
                    # Closed with bytes unread: the kernel sends a reset, not a FIN.
                with socket.create_connection(fwd.address) as conn:
                    conn.sendall(b"hello")
                    assert conn.recv(10).startswith(b"x")
        finally:
            job.cancel(grace=0)
            job.wait(timeout=30)
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == []
