"""Forwards on the agent's own host are handed the job's connected socket (a real agent, real
jobs): no byte passes through the agent, and none through a private job's relay. The
WebSocket way, which remote clients take, still carries the same bytes."""

from __future__ import annotations

import json
import os
import socket
import stat
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhop.client import GpuhopError, Job
from gpuhop.client.transport import handoff
from tests.conftest import wait_until
from tests.integration.test_forward import PAGE, SERVERS, echo_through, job_log, start_servers
from tests.integration.test_private_network import ECHO

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def servers(shared_agent, tmp_path_factory) -> Iterator[tuple[Job, int, int]]:
    """A job serving HTTP and echo on the host's loopback, as in test_forward."""
    root = tmp_path_factory.mktemp("servers")
    (root / "servers.py").write_text(SERVERS)
    (root / "www").mkdir()
    (root / "www" / "index.html").write_text(PAGE)
    with shared_agent.client() as client:
        job, http_port, echo_port = start_servers(client, root)
        try:
            yield job, http_port, echo_port
        finally:
            job.cancel(grace=0)
            job.wait(timeout=30)


def raw_request(path: Path, line: bytes) -> dict:
    """The agent's answer to one raw handoff request line (no socket expected)."""
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(30)
        conn.connect(str(path))
        conn.sendall(line)
        answer, fds, _, _ = socket.recv_fds(conn, 65536, 1)
    assert fds == []
    return json.loads(answer)


def test_a_forward_on_the_agents_host_gets_the_jobs_socket(shared_agent, servers):
    job, http_port, echo_port = servers
    path = shared_agent.paths.handoff
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    sock = handoff.connect(str(path), job.id, echo_port)
    assert sock is not None
    with sock:
        # The job's own listener at the far end, not the agent.
        assert sock.family == socket.AF_INET
        assert sock.getpeername() == ("127.0.0.1", echo_port)
        sock.sendall(b"straight to the job")
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(100) == b"straight to the job"
    with (
        job.forward(http_port) as fwd,
        urllib.request.urlopen(f"{fwd.url}/index.html", timeout=30) as response,
    ):
        assert response.read().decode() == PAGE


def test_handoff_refusals_say_what_is_wrong(shared_agent, servers):
    job, _, echo_port = servers
    path = str(shared_agent.paths.handoff)
    with pytest.raises(GpuhopError, match="no job matches 'nosuchjob'") as e:
        handoff.connect(path, "nosuchjob", echo_port)
    assert (e.value.status, e.value.code) == (404, "not_found")
    with pytest.raises(GpuhopError, match="a port is a number 1-65535") as e:
        handoff.connect(path, job.id, 70000)
    assert e.value.status == 400
    nothing = 1 if echo_port != 1 else 2
    with pytest.raises(GpuhopError, match=f"nothing listening on port {nothing}") as e:
        handoff.connect(path, job.id, nothing)
    assert (e.value.status, e.value.code) == (502, "not_listening")
    answer = raw_request(shared_agent.paths.handoff, b"not json\n")
    assert answer["status"] == 400 and "one line of JSON" in answer["message"]
    answer = raw_request(shared_agent.paths.handoff, b'{"port": 80}\n')
    assert answer["status"] == 400 and "names its job" in answer["message"]
    # An agent without a handoff socket (an older one): the forward takes the WebSocket.
    assert handoff.connect(path + ".absent", job.id, echo_port) is None


def test_the_websocket_way_carries_the_same_bytes(shared_agent, servers):
    """What a client through SSH or TLS gets: the local agent's socket, without handoff."""
    job, http_port, echo_port = servers
    with shared_agent.client() as client:
        client.session.endpoint.handoff = None
        remote_like = client.job(job.id)
        with remote_like.forward(echo_port) as fwd:
            payload = os.urandom(3 * 1024 * 1024)
            assert echo_through(fwd.address, payload) == payload
        with (
            remote_like.forward(http_port) as fwd,
            urllib.request.urlopen(f"{fwd.url}/index.html", timeout=30) as response,
        ):
            assert response.read().decode() == PAGE


def test_a_private_jobs_relay_hands_over_its_connection(shared_agent, project, tmp_path):
    root = project({"echo.py": ECHO})
    port_file = tmp_path / "port"
    with shared_agent.client() as client:
        job = client.submit(["echo.py", str(port_file)], workdir=root, private_network=True)
        try:
            wait_until(lambda: b"listening on" in job_log(job), timeout=60)
            port = int(port_file.read_text())
            sock = handoff.connect(str(shared_agent.paths.handoff), job.id, port)
            assert sock is not None
            with sock:
                # A TCP connection inside the job's network: the relay is out of the path.
                assert sock.family == socket.AF_INET
                assert sock.getpeername() == ("127.0.0.1", port)
                sock.sendall(b"no relay in between")
                sock.shutdown(socket.SHUT_WR)
                assert sock.recv(100) == b"no relay in between"
            client.session.endpoint.handoff = None  # and over the WebSocket, through the agent
            with job.forward(port) as fwd:
                assert echo_through(fwd.address, b"hello") == b"hello"
        finally:
            job.cancel(grace=0)
            job.wait(timeout=30)
