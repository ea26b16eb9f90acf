"""Jobs in a private network namespace: nothing of theirs is reachable from the host's
network, yet `forward` reaches their ports through the leader's relay (a real agent)."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from gpuhop.api import JobState
from gpuhop.client import GpuhopError
from tests.conftest import wait_until
from tests.integration.test_forward import echo_through, job_log
from tests.listening import assert_listens_apart_from_the_host, taken_on_the_host

pytestmark = pytest.mark.timeout(120)

# An echo server bound to every interface of its network, as TensorFlow's server binds.
ECHO = """
import os, socket, sys, threading
server = socket.create_server(("0.0.0.0", 0))
port = server.getsockname()[1]
open(sys.argv[1], "w").write(str(port))
lines = open("/proc/self/net/dev").readlines()[2:]  # this process's network namespace
print("interfaces:", sorted(line.split(":")[0].strip() for line in lines), flush=True)
print(f"listening on {port}", flush=True)

def echo(conn):
    with conn:
        while data := conn.recv(1 << 16):
            conn.sendall(data)

while True:
    conn, _ = server.accept()
    threading.Thread(target=echo, args=(conn,), daemon=True).start()
"""


def host_addresses() -> list[str]:
    """This host's IPv4 addresses, loopback included, as other hosts or local users use."""
    found = {"127.0.0.1"}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
            found.add(s.getsockname()[0])
        except OSError:
            pass
    return sorted(found)


def assert_unreachable_from_the_host(job_dir: Path, port: int) -> None:
    assert_listens_apart_from_the_host(job_dir, port)
    if taken_on_the_host(port):
        return  # another program's, on the host: a connection there would reach it
    for address in host_addresses():
        with pytest.raises(OSError):
            socket.create_connection((address, port), timeout=2).close()


def test_a_private_job_is_reachable_only_through_the_agent(shared_agent, project, tmp_path):
    root = project({"echo.py": ECHO})
    port_file = tmp_path / "port"
    with shared_agent.client() as client:
        job = client.submit(["echo.py", str(port_file)], workdir=root, private_network=True)
        try:
            wait_until(lambda: b"listening on" in job_log(job), timeout=60)
            assert job.refresh().private_network
            port = int(port_file.read_text())
            assert "interfaces: ['lo']" in job_log(job).decode()
            assert_unreachable_from_the_host(shared_agent.paths.job_dir(job.id), port)
            relay = shared_agent.paths.job_dir(job.id) / "ports.sock"
            assert stat.S_IMODE(relay.stat().st_mode) == 0o600
            with job.forward(port) as fwd:
                assert echo_through(fwd.address, b"hello") == b"hello"
                payload = os.urandom(3 * 1024 * 1024)
                assert echo_through(fwd.address, payload) == payload
            with pytest.raises(GpuhopError, match=r"private network\) has nothing listening on"):
                job.forward(port + 1 if port < 65535 else port - 1)
        finally:
            job.cancel(grace=0)
            job.wait(timeout=30)
    assert not relay.exists()


def test_a_multi_worker_job_port_is_forwarded(shared_agent, project, tmp_path):
    root = project(
        {"echo.py": ECHO.replace("sys.argv[1]", "sys.argv[1] + os.environ['GPUHOP_WORKER_INDEX']")}
    )
    with shared_agent.client() as client:
        job = client.submit(["echo.py", str(tmp_path / "port")], workdir=root, workers=2)
        try:
            wait_until(lambda: job_log(job).count(b"listening on") == 2, timeout=60)
            assert job.refresh().private_network
            port = int((tmp_path / "port0").read_text())
            assert_unreachable_from_the_host(shared_agent.paths.job_dir(job.id), port)
            with job.forward(port) as fwd:
                assert echo_through(fwd.address, b"worker 0?") == b"worker 0?"
        finally:
            job.cancel(grace=0)
            info = job.wait(timeout=30)
    assert info.state == JobState.cancelled


# What PyTorch's init_process_group() does with them (env://): worker 0 serves a store on
# MASTER_ADDR:MASTER_PORT, and every RANK of WORLD_SIZE joins it there.
RENDEZVOUS = """
import os, socket, time
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
assert (rank, os.environ["LOCAL_RANK"]) == (int(os.environ["GPUHOP_WORKER_INDEX"]), "0")
if rank == 0:
    with socket.create_server((addr, port)) as server:
        joined = sorted(server.accept()[0].recv(16).decode() for _ in range(size - 1))
    print(f"store: ranks {joined} of {size} joined", flush=True)
else:
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection((addr, port)) as conn:
                conn.sendall(str(rank).encode())
                break
        except ConnectionRefusedError:
            assert time.monotonic() < deadline, "rank 0's store never listened"
            time.sleep(0.05)
"""


def test_a_pytorch_gang_finds_its_rendezvous_in_the_environment(shared_agent, project):
    # torch.distributed's env:// wanted MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE, which
    # a gang was not given ("environment variable RANK expected, but not set").
    root = project({"ddp.py": RENDEZVOUS})
    with shared_agent.client() as client:
        job = client.submit(["ddp.py"], workdir=root, workers=3)
        info = job.wait(timeout=120)
        log = b"".join(job.logs()).decode()
    assert info.state == JobState.succeeded, log
    assert "[worker 0] store: ranks ['1', '2'] of 3 joined" in log


# Worker 1's first attempt fails; every attempt of every worker says which it is. Worker 1
# fails only once worker 0 has said its line (worker 0 tells it so through MASTER_ADDR:
# MASTER_PORT): a gang's failure ends its other workers, and on a loaded machine worker 0
# could be ended before its line.
RETRIED_GANG = """
import os, socket, sys, time
attempt, index = os.environ["GPUHOP_ATTEMPT"], os.environ["GPUHOP_WORKER_INDEX"]
print(f"attempt {attempt} worker {index}", flush=True)
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
if attempt == "1" and index == "0":
    with socket.create_server((addr, port)) as server:
        server.accept()[0].close()
elif attempt == "1":
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection((addr, port)).close()
            break
        except ConnectionRefusedError:
            assert time.monotonic() < deadline, "worker 0 never listened"
            time.sleep(0.05)
    sys.exit(3)
"""


def test_a_retried_gangs_log_holds_each_attempts_lines_once(shared_agent, project):
    root = project({"gang.py": RETRIED_GANG})
    with shared_agent.client() as client:
        job = client.submit(["gang.py"], workdir=root, workers=2, retries=1, retry_on="any")
        info = job.wait(timeout=120)
        log = b"".join(job.logs()).decode()
        worker1 = b"".join(job.logs(worker=1)).decode()
    assert (info.state, info.attempt) == (JobState.succeeded, 2), info.reason
    lines = sorted(line for line in log.splitlines() if line.startswith("[worker "))
    # Each worker's own log keeps every attempt; the job's log adds each line once, not
    # attempt 1's again when attempt 2 starts.
    assert lines == [
        "[worker 0] attempt 1 worker 0",
        "[worker 0] attempt 2 worker 0",
        "[worker 1] attempt 1 worker 1",
        "[worker 1] attempt 2 worker 1",
    ]
    assert worker1 == "attempt 1 worker 1\nattempt 2 worker 1\n"
