"""Remote TensorFlow ops: a real tf-server job on a real agent, a client in another process
connected through the agent's tunnel, real TensorFlow on the CPU; and the ways it fails."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhop.client import Job, tfservers
from gpuhop.tf.remote import _tunnel_command
from tests.conftest import Agent, wait_until
from tests.listening import assert_listens_apart_from_the_host, taken_on_the_host

pytestmark = [pytest.mark.tf, pytest.mark.timeout(300)]

# The user's side: prints one JSON line per event, so the test can follow it.
# "connect-only" never reaches TensorFlow, so it does not import it (seconds per run).
CLIENT = """
import json, sys, time
import gpuhop.tf

mode, name = sys.argv[1], sys.argv[2]

def say(**kw):
    print(json.dumps(kw), flush=True)

if mode == "connect-only":
    try:
        gpuhop.tf.connect(job=name, ready_timeout=5)
    except gpuhop.tf.RemoteError as e:
        say(error=str(e))
    sys.exit()
import numpy as np
import tensorflow as tf
x = np.random.default_rng(0).standard_normal((64, 64)).astype("float32")
if mode == "compare":
    data = np.random.default_rng(1).standard_normal((32, 4)).astype("float32")
    target = data @ np.array([[1.0], [-2.0], [3.0], [0.5]], dtype="float32")
    def train(device):
        with tf.device(device):
            w = tf.Variable(tf.ones((4, 1)))
            @tf.function
            def step():
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean((tf.matmul(data, w) - target) ** 2)
                w.assign_sub(0.1 * tape.gradient(loss, w))
                return loss
            losses = [float(step()) for _ in range(3)]
            return losses, w.numpy().ravel().tolist(), w.device
    local_mm = tf.matmul(x, x).numpy()
    local_train = train("/cpu:0")
    with gpuhop.tf.connect(job=name) as remote:
        device = gpuhop.tf.remote_device()
        with tf.device(device):
            mm = tf.matmul(x, x)
        remote_train = train(device)
        try:
            gpuhop.tf.remote_device("GPU")
        except gpuhop.tf.RemoteError as e:
            say(no_gpu=str(e))
        say(device=device, devices=remote.devices, mm_device=mm.device,
            mm_equal=bool(np.allclose(mm.numpy(), local_mm, rtol=1e-5, atol=1e-4)),
            local=local_train[:2], remote=remote_train[:2], var_device=remote_train[2])
    say(after=tf.matmul(x, x).device)
else:  # "loop": remote ops until something fails (a server silent STALL s is frozen)
    try:
        stall = float(sys.argv[3])
        with gpuhop.tf.connect(job=name, stall_timeout=stall, probe_interval=0.5):
            say(connected=True)
            with tf.device(gpuhop.tf.remote_device()):
                while True:
                    tf.matmul(x, x).numpy()
                    time.sleep(0.05)
    except gpuhop.tf.RemoteError as e:
        say(error=str(e), cause=type(e.__cause__).__name__)
"""


def run_client(agent: Agent, tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        env=agent.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def events(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def server_pid(agent: Agent, job: Job) -> int:
    """The TensorFlow server's own process: the child of the job's leader."""
    leader = json.loads((agent.paths.job_dir(job.id) / "shim.pid").read_text())["pid"]
    children = Path(f"/proc/{leader}/task/{leader}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


@contextlib.contextmanager
def started(agent: Agent, name: str) -> Iterator[Job]:
    with agent.client() as client:
        job = tfservers.start(client, name=name, timeout=120)
        try:
            yield job
        finally:
            if not job.refresh().state.finished:
                job.cancel(grace=0)
                job.wait(timeout=30)


@pytest.fixture(scope="module")
def kept_server(shared_agent: Agent) -> Iterator[Job]:
    """A server the tests that leave it running share (each start imports TensorFlow)."""
    with started(shared_agent, "tf-kept") as job:
        yield job


@pytest.fixture
def server(shared_agent: Agent, request: pytest.FixtureRequest) -> Iterator[Job]:
    """A server of the test's own, for a test that ends it."""
    with started(shared_agent, f"tf-{request.node.name[5:30].replace('_', '-')}") as job:
        yield job


def test_remote_results_equal_local_and_no_port_is_exposed(shared_agent, kept_server, tmp_path):
    server = kept_server
    port = tfservers.port_of(server.info)
    # The server listens on every interface of its own network; the host sees none of it.
    assert_listens_apart_from_the_host(shared_agent.paths.job_dir(server.id), port)
    for address in ("127.0.0.1", socket.gethostbyname(socket.gethostname())):
        if taken_on_the_host(port):
            break  # another program's, on the host: a connection there would reach it
        with pytest.raises(OSError):
            socket.create_connection((address, port), timeout=2).close()
    client = run_client(shared_agent, tmp_path, "compare", server.info.name)
    out, err = client.communicate(timeout=240)
    assert client.returncode == 0, err
    no_gpu, result, after = events(out)
    assert no_gpu["no_gpu"] == (
        f"the TensorFlow server (job {server.id}) has no GPU:0; it has CPU:0. For GPUs, start"
        " it with some: gpuhop tf-server start --gpus N"
    )
    assert result["device"] == "/job:worker/replica:0/task:0/device:CPU:0"
    assert result["devices"] == ["/job:worker/replica:0/task:0/device:CPU:0"]
    assert result["mm_device"] == result["device"] and result["mm_equal"]
    assert result["var_device"] == result["device"]
    (local_losses, local_w), (remote_losses, remote_w) = result["local"], result["remote"]
    assert local_losses[-1] < local_losses[0]  # it trains
    assert remote_losses == pytest.approx(local_losses, rel=1e-5)
    assert remote_w == pytest.approx(local_w, rel=1e-5)
    # Closing resets TensorFlow's context: ops run locally again.
    assert after["after"].endswith("/device:CPU:0") and "job:worker" not in after["after"]


def test_no_server_is_a_clear_error(shared_agent, tmp_path):
    client = run_client(shared_agent, tmp_path, "connect-only", "no-such-server")
    out, err = client.communicate(timeout=120)
    assert client.returncode == 0, err
    (result,) = events(out)
    assert "no TensorFlow server 'no-such-server'" in result["error"]
    assert "gpuhop tf-server start --name no-such-server" in result["error"]


def test_a_cancelled_server_fails_the_op_in_flight(shared_agent, server, tmp_path):
    # A stall timeout far longer than a busy machine's late answer: the end is told by the
    # agent, not guessed from silence.
    client = run_client(shared_agent, tmp_path, "loop", server.info.name, "60")
    assert client.stdout is not None
    assert json.loads(client.stdout.readline()) == {"connected": True}
    server.cancel(grace=0)
    # Bounded: the loop of remote ops ends with an error rather than hanging.
    out, err = client.communicate(timeout=120)
    (result,) = events(out)
    assert f"the TensorFlow server (job {server.id}) has ended: cancelled" in result["error"]
    assert "gpuhop tf-server start" in result["error"]
    assert result["cause"] == "UnavailableError"
    assert "gpuhop: the TensorFlow server" in err  # said at once, even mid-op


def test_a_frozen_server_fails_the_op_in_flight(shared_agent, kept_server, tmp_path):
    server = kept_server
    pid = server_pid(shared_agent, server)
    # 10 s: a probe answered late on a busy machine before the freeze is not taken for one.
    client = run_client(shared_agent, tmp_path, "loop", server.info.name, "10")
    assert client.stdout is not None
    assert json.loads(client.stdout.readline()) == {"connected": True}
    os.kill(pid, signal.SIGSTOP)
    try:
        out, _ = client.communicate(timeout=60)
    finally:
        os.kill(pid, signal.SIGCONT)
    (result,) = events(out)
    assert f"the TensorFlow server (job {server.id}) stopped answering" in result["error"]
    assert "frozen" in result["error"] and "no answer within 10s" in result["error"]
    assert result["cause"] == "UnavailableError"
    # The server itself is fine once it runs again: a new connection works.
    wait_until(lambda: tfservers.wait_ready(server, 30) is None, timeout=60)


def test_the_tunnel_ends_cleanly_when_its_server_does(shared_agent, server):
    """The helper process says why and exits on its own while the user's process still
    holds its stdin (stuck in TensorFlow, say): without an interpreter abort on the way."""
    tunnel = subprocess.Popen(
        _tunnel_command(None, None, server.id, tfservers.port_of(server.info), 60, 0.5),
        env=shared_agent.env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert tunnel.stdin is not None and tunnel.stdout is not None and tunnel.stderr is not None
    with tunnel, tunnel.stdin:
        assert tunnel.stdout.readline().startswith(b"ready ")
        server.cancel(grace=0)
        said = tunnel.stdout.readline().decode()
        assert said.startswith(f"failed the TensorFlow server (job {server.id}) has ended")
        assert tunnel.wait(timeout=60) == 0
        err = tunnel.stderr.read().decode()
    assert err.startswith(f"gpuhop: the TensorFlow server (job {server.id}) has ended")
    assert "Fatal Python error" not in err
