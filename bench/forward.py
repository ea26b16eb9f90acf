"""Port forwarding: a tiny request/response and a bulk echo through `Job.forward`, next to
the same over a direct loopback connection to the job's port (what a user on the GPU host
itself would get).

The job is a TCP echo server on the host's loopback. Round trips go over one connection
(as TensorFlow's gRPC channel or a notebook's kernel socket would), TCP_NODELAY on both
paths; each sample is the median of many round trips. The bulk row sends a payload and
reads it back, concurrently, over one connection.
"""

from __future__ import annotations

import os
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

from harness import Row, Settings, private_agent, wait_until

NAME = "forward"
ECHO = """
import socket, sys, threading

def echo(conn):
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
    with conn:
        while data := conn.recv(1 << 18):
            conn.sendall(data)

server = socket.create_server(("127.0.0.1", int(sys.argv[1])))
print("listening", flush=True)
while True:
    threading.Thread(target=echo, args=(server.accept()[0],), daemon=True).start()
"""
MESSAGE = b"x" * 64


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def round_trip_us(address: tuple[str, int], count: int) -> float:
    """The median microseconds of `count` 64-byte round trips over one connection."""
    with socket.create_connection(address) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        for _ in range(50):  # warm-up: the tunnel's WebSocket opens on the first bytes
            conn.sendall(MESSAGE)
            _read(conn, len(MESSAGE))
        times = []
        for _ in range(count):
            start = time.perf_counter()
            conn.sendall(MESSAGE)
            _read(conn, len(MESSAGE))
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def bulk_mb_per_s(address: tuple[str, int], size: int) -> float:
    payload = os.urandom(size)
    with socket.create_connection(address) as conn:
        start = time.perf_counter()
        sender = threading.Thread(target=conn.sendall, args=(payload,))
        sender.start()
        _read(conn, size)
        elapsed = time.perf_counter() - start
        sender.join()
    return size / elapsed / 1e6


def _read(conn: socket.socket, n: int) -> None:
    view = memoryview(bytearray(n))
    got = 0
    while got < n:
        k = conn.recv_into(view[got:])
        if not k:
            raise ConnectionError("the echo server closed early")
        got += k


def run(settings: Settings) -> list[Row]:
    repeats = settings.repeats(default=5, quick=2)
    count = 500 if settings.quick else 2000
    size = (16 if settings.quick else 64) * 1024 * 1024
    rtt: dict[str, list[float]] = {"gpuhop": [], "direct": []}
    bulk: dict[str, list[float]] = {"gpuhop": [], "direct": []}
    with tempfile.TemporaryDirectory(prefix="gpuhop-bench-") as tmp:
        root = Path(tmp)
        (root / "project").mkdir()
        (root / "project" / "echo.py").write_text(ECHO)
        port = free_port()
        with private_agent(root / "agent") as agent, agent.client() as client:
            job = client.submit(["echo.py", str(port)], workdir=root / "project")
            wait_until(lambda: b"listening" in b"".join(job.logs()), timeout=60)
            try:
                with job.forward(port) as fwd:
                    paths = {"gpuhop": fwd.address, "direct": ("127.0.0.1", port)}
                    for _ in range(repeats):
                        for name, address in paths.items():
                            rtt[name].append(round_trip_us(address, count))
                            bulk[name].append(bulk_mb_per_s(address, size))
            finally:
                job.cancel(grace=0)
    return [
        Row(
            NAME,
            "64-byte request/response round trip, one connection",
            "µs",
            rtt["gpuhop"],
            "direct loopback connection",
            rtt["direct"],
            f"median of {count} round trips per sample; local agent socket",
        ),
        Row(
            NAME,
            f"{size >> 20} MiB echoed back over one connection",
            "MB/s",
            bulk["gpuhop"],
            "direct loopback connection",
            bulk["direct"],
            "higher is better (ratio below 1 is slower)",
        ),
    ]
