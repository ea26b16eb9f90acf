"""An answer's head goes out with its body (agent.server.protocol._HeldHead): on a real agent's
socket, the bytes of each answer are still its head and its body, whole; a stream still gets
its head before any chunk (`logs -f` of a silent job sees its headers at once)."""

from __future__ import annotations

import json
import socket

from gpuhop.api import JobState
from tests.conftest import wait_until

SILENT = """
import os, time
go = os.path.join(os.environ["GPUHOP_ARTIFACTS_DIR"], "go")
while not os.path.exists(go):
    time.sleep(0.02)
print("spoke", flush=True)
"""
# A hang guard only: every read below waits for bytes the agent sends at once.
HANG = 60


def connect(sock_path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(HANG)
    s.connect(sock_path)
    return s


def get(sock_path: str, target: str) -> bytes:
    """Everything the agent sends for one GET that closes the connection."""
    with connect(sock_path) as s:
        s.sendall(f"GET {target} HTTP/1.1\r\nhost: agent\r\nconnection: close\r\n\r\n".encode())
        got = b""
        while piece := s.recv(65536):
            got += piece
    return got


def split(answer: bytes) -> tuple[str, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    return status, dict(line.split(": ", 1) for line in lines), body


def dechunked(body: bytes) -> bytes:
    """The data of a chunked body (RFC 9112 7.1), whole up to its last chunk."""
    data, rest = b"", body
    while True:
        size, _, rest = rest.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            return data
        data, rest = data + rest[:n], rest[n + 2 :]


def test_each_answer_is_its_head_then_its_whole_body(shared_agent, project):
    root = project({"hi.py": "print('hi')\n"})
    with shared_agent.client() as client:
        job = client.submit(["hi.py"], workdir=root)
        assert job.wait(60).state == JobState.succeeded
        listing = client.jobs_json(limit=50)
    sock = str(shared_agent.paths.socket)

    status, headers, body = split(get(sock, "/v1/jobs?limit=50"))
    assert status == "HTTP/1.1 200 OK"
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    assert int(headers["content-length"]) == len(body)
    assert [j["id"] for j in listing] == [j["id"] for j in json.loads(body)]

    status, headers, body = split(get(sock, f"/v1/jobs/{job.id}"))  # a FastAPI route
    assert status == "HTTP/1.1 200 OK" and int(headers["content-length"]) == len(body)
    assert json.loads(body)["id"] == job.id

    status, headers, body = split(get(sock, "/v1/jobs/no-such-job"))  # its error handler
    assert status == "HTTP/1.1 404 Not Found" and int(headers["content-length"]) == len(body)
    assert "no-such-job" in body.decode()

    status, headers, body = split(get(sock, f"/v1/jobs/{job.id}/log"))  # a finished stream
    assert status == "HTTP/1.1 200 OK" and headers["transfer-encoding"] == "chunked"
    assert body == b"3\r\nhi\n\r\n0\r\n\r\n"


def test_a_followed_silent_job_sends_its_head_before_any_line(shared_agent, project):
    root = project({"silent.py": SILENT})
    with shared_agent.client() as client:
        job = client.submit(["silent.py"], workdir=root)
        try:
            with connect(str(shared_agent.paths.socket)) as s:
                s.sendall(
                    f"GET /v1/jobs/{job.id}/log?follow=true HTTP/1.1\r\nhost: a\r\n\r\n".encode()
                )
                got = b""
                while b"\r\n\r\n" not in got:
                    piece = s.recv(65536)
                    assert piece, got
                    got += piece
                status, headers, body = split(got)
                assert status == "HTTP/1.1 200 OK" and headers["x-gpuhop-job"] == job.id
                assert body == b""  # nothing printed yet: the head came alone
                # A follow answers at once, queued or not: the job may not have started yet
                # (its artifacts dir not made) on a busy machine.
                wait_until(lambda: job.refresh().state == JobState.running, HANG)
                (shared_agent.home / "jobs" / job.id / "artifacts" / "go").touch()
                while b"0\r\n\r\n" not in body:
                    piece = s.recv(65536)
                    assert piece, body
                    body += piece
                # The line, then the stream's end. How it is cut in chunks is the reads': the
                # job's unbuffered print writes "spoke" and "\n" apart, and a read may fall
                # between them (one fresh-clone run beside a CPU hog sent 5 bytes, then 1).
                assert dechunked(body) == b"spoke\n" and body.endswith(b"0\r\n\r\n"), body
            assert job.wait(60).state == JobState.succeeded
        finally:
            if not job.refresh().state.finished:
                job.cancel(grace=0)
